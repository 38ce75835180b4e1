"""Benchmarks runnable from the CLI (``loraplex bench ...``); each prints one JSON line."""
