"""How requests and cache calls reach an engine and how its output comes back: the engine in a
child process (``process.py``, the default; the child's side in ``process_child.py`` and
``child_loop.py``, typed messages in ``messages.py``) or on a thread here
(``thread_client.py``). Torch-free at import time, so the HTTP process that runs the clients
loads no torch: the engine child's builder (``worker.WorkerHandles``) imports it there."""
