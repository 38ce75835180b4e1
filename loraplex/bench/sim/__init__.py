"""``loraplex bench sim``: the simulator against real runs (calibration, validation, scale)."""
