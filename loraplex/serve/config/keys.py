"""Config file keys and ``ServeConfig`` field names: the same but where a flag's name differs
from its field's (``--threads`` sets ``torch_threads``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# File keys that are not field names: the key is the flag's name (``--threads``).
FILE_KEYS: Mapping[str, str] = MappingProxyType({"threads": "torch_threads"})


def file_key(name: str) -> str:
    """The config file key of the field ``name``: its flag's name (``torch_threads``: threads)."""
    return next((key for key, field_name in FILE_KEYS.items() if field_name == name), name)


def flag_name(name: str) -> str:
    """The ``loraplex serve`` flag that sets the field ``name`` (``torch_threads``: --threads,
    ``demo``: --no-demo): its file key, dashed."""
    if name == "demo":
        return "--no-demo"
    return "--" + file_key(name).replace("_", "-")


# ServeConfig keys a fleet does not read: the engine runs in each replica's own process (and the
# ingress cannot pause a replica's request: ``stream_pause_bytes``, ``max_stream_resumes`` and
# ``max_paused_kv_fraction``, ``fleet/engine_client.py``).
NOT_IN_FLEET = (
    "engine_process",
    "engine_hung_kill_after_s",
    "engine_unresponsive_after_s",
    "stream_pause_bytes",
    "max_stream_resumes",
    "max_paused_kv_fraction",
)
