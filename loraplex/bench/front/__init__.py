"""``loraplex bench front``: the HTTP (front) process of ``loraplex serve`` with its engine in a
child process: its resident memory, whether it mapped torch, and its start-to-ready time."""
