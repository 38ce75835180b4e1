"""``loraplex bench traces``: throughput with request traces on over off (``bench.py`` drives
it)."""
