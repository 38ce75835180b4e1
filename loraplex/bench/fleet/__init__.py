"""``loraplex bench fleet``: routing policies over engine replicas (``bench.py`` drives it)."""
