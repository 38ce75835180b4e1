"""``loraplex serve``'s configuration: one frozen record, from a TOML file and/or flags.

``record.py`` (``ServeConfig``: the fields, which are the TOML keys, and the budgets derived from
them), ``checks.py`` (the checks of its values, in the order ``ServeConfig`` runs them),
``keys.py`` (file keys that are not field names), ``file.py`` (the ``[serve]`` table of a TOML
file, and flags merged over it).
"""

from loraplex.devices import memory_total_bytes
from loraplex.serve.config.file import (
    SettingsRefused,
    file_keys,
    merge,
    read_config_file,
    settled,
)
from loraplex.serve.config.keys import file_key, flag_name
from loraplex.serve.config.record import (
    DEFAULT_CPU_ADAPTER_BYTES,
    DEFAULT_TENANT_TIER_SHARE,
    ServeConfig,
)

__all__ = [
    "DEFAULT_CPU_ADAPTER_BYTES",
    "DEFAULT_TENANT_TIER_SHARE",
    "ServeConfig",
    "SettingsRefused",
    "file_key",
    "file_keys",
    "flag_name",
    "memory_total_bytes",
    "merge",
    "read_config_file",
    "settled",
]
