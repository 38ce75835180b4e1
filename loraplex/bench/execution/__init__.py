"""``loraplex bench execution``: the batched LoRA forward against its baselines (``bench.py``
drives it)."""
