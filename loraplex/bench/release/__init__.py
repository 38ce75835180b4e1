"""``loraplex bench release``: controlled releases under steady traffic (``bench.py`` drives
it)."""
