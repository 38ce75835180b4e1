"""``loraplex bench peer``: loraplex against vLLM's CPU build (``bench.py`` drives it)."""
