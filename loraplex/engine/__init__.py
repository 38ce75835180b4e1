"""Serving engine: request state machine, torch-free scheduler, paged KV cache, runner and the
engine loop behind ``EngineClient`` (see ``protocol.py``, the seam the server codes against)."""
