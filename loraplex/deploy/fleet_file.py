"""A RayService fleet's own keys: the ``[fleet]`` table of ``--serve-config`` (``fleet up``'s).

The RayService's builder (``loraplex.fleet.app:build``) takes them in its ``args`` as a ``fleet``
mapping beside the ``serve`` keys, as the file holds them in two tables (one name, ``policy``,
is a key of both). They are checked here with the ``FleetSettings`` validation the builder
applies, so a bad value fails at render time and not in a Serve application that never deploys.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loraplex.deploy.serve_file import POD_DATA_DIR, ServeFileError
from loraplex.fleet.settings import FLEET_KEYS, FleetSettings
from loraplex.serve.config import ServeConfig

# The fleet keys the rendered RayService sets itself, and what sets each.
RENDERED_FLEET_KEYS = {
    "replicas": "--replicas (the engine worker group's size, one engine replica per worker)",
    "engine_resource": "the rendered manifests (the custom resource every engine worker "
    "advertises)",
}


def check_fleet_values(values: Mapping[str, Any], serve: ServeConfig, replicas: int) -> None:
    """Refuses unknown and rendered keys, then builds the ``FleetSettings`` the builder would
    (``replicas``: the engine replicas ``--replicas`` renders)."""
    unknown = sorted(str(key) for key in values if key not in FLEET_KEYS)
    if unknown:
        raise ServeFileError(
            unknown[0], f"[fleet] keys {unknown} are unknown; expected some of {FLEET_KEYS}"
        )
    rendered = sorted(set(values) & set(RENDERED_FLEET_KEYS))
    if rendered:
        key = rendered[0]
        raise ServeFileError(
            key, f"[fleet] key {key!r} is set by {RENDERED_FLEET_KEYS[key]}; remove it"
        )
    try:
        FleetSettings(serve=serve, model_dir=Path(POD_DATA_DIR), engine_replicas=replicas, **values)
    except (TypeError, ValueError) as exc:
        raise ServeFileError("serve_config", f"[fleet]: {exc}") from exc
