"""``loraplex bench signing``: the cold-load cost of the fetch-time signature check (``bench.py``
drives it; ``shaped_adapters.py`` writes a preset's shapes with random weights)."""
