"""``loraplex bench cache``: the adapter cache's stage costs, replays and scale (``bench.py``
drives it)."""
