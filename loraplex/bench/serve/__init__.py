"""``loraplex bench serve``: trace replays, throughput and attacks over HTTP (``bench.py``
drives it)."""
