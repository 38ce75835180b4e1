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
