"""The ``loraplex serve`` settings a deployment passes through a TOML file in a ConfigMap.

Flags cover what every deployment sets; the rest of ``ServeConfig`` (budgets, scheduler, limits,
some keys TOML-only) travels as the ``[serve]`` table the operator gives, checked here with the
same ``ServeConfig`` validation ``loraplex serve`` applies, so a bad value fails at render time
and not in a crash-looping pod.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loraplex.serve.config import ServeConfig, file_key

# Keys the rendered manifests set themselves (listeners, locations, credentials, the device)
# or that name a path on the operator's machine rather than in the pod.
RESERVED_SERVE_KEYS = frozenset(
    {
        "host",
        "port",
        "admin_port",
        "admin_host",
        "data_dir",
        "database_url",
        "store",
        "s3_endpoint",
        "admin_key",
        "import_dir",
        "model",
        "demo",
        "device",
        "metrics_public",
        "max_loras",
    }
)
POD_DATA_DIR = "/var/lib/loraplex"
_SECRET_URL_STAND_IN = "redis://from-the-secret"  # never rendered: only for the checks


class ServeFileError(ValueError):
    """A ``[serve]`` key that cannot be rendered; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def check_serve_values(values: Mapping[str, Any], max_loras: int) -> ServeConfig:
    """Refuses reserved keys, then builds (and returns) the ``ServeConfig`` a replica would
    build."""
    reserved = sorted(set(values) & RESERVED_SERVE_KEYS)
    if reserved:
        raise ServeFileError(
            reserved[0],
            f"serve config key {reserved[0]!r} is set by the rendered manifests "
            "(use the k8s render flag of that name, if any); expected none of "
            f"{sorted(RESERVED_SERVE_KEYS)}",
        )
    shared = values.get("shared_state_url")
    if isinstance(shared, str) and urlsplit(shared).password is not None:
        raise ServeFileError(
            "shared_state_url",
            "serve config key 'shared_state_url' holds a password, which the rendered manifests "
            "would carry in plain text; expected none inline: put the whole URL under the "
            "secret's key 'shared-state-url' and leave the key out",
        )
    for key, value in values.items():
        if not isinstance(value, bool | int | float | str):
            raise ServeFileError(key, f"serve config key {key!r} is invalid; expected a scalar")
    checked = dict(values)
    if "shared_state_url" not in checked and "shared_state_prefix" in checked:
        # NOTE: the URL may come from the secret's 'shared-state-url' (an env variable the
        # replica reads); a stand-in lets the prefix be checked here, the pair by the replica.
        checked["shared_state_url"] = _SECRET_URL_STAND_IN
    try:
        return ServeConfig(data_dir=Path(POD_DATA_DIR), max_loras=max_loras, **checked)
    except (TypeError, ValueError) as exc:
        raise ServeFileError("serve_config", f"serve config: {exc}") from exc


def toml_text(values: Mapping[str, Any]) -> str:
    """A ``[serve]`` table holding ``values`` (field names, scalars only) under their file keys,
    sorted by field name."""
    lines = ["[serve]"]
    lines += [f"{file_key(key)} = {_toml_scalar(values[key])}" for key in sorted(values)]
    return "\n".join(lines) + "\n"


def _toml_scalar(value: bool | int | float | str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    # NOTE: a JSON string is a TOML basic string as long as '/' is not escaped (json never does)
    # and non-ASCII stays raw (ensure_ascii=False: no surrogate-pair escapes, which TOML refuses).
    return json.dumps(value, ensure_ascii=False)
