"""``loraplex.fleet.app:build``: the fleet as a Ray Serve application built from ``args``, for
``serve run`` of a Serve config file that names it and a KubeRay ``RayService`` (``loraplex k8s
render --ray``), where the Serve controller calls it.

``args`` holds any ``serve`` configuration key (``max_loras``, ``store``, ``model``, ...) and the
fleet's keys (``settings.FLEET_KEYS``: ``replicas``, ``policy``, ``seed``, ``report_period_s``,
``stale_after_s``, ``router``, ``topology``, ``engine_resource``): either in a ``fleet`` mapping,
as ``fleet up --config``'s ``[fleet]`` table (then ``policy`` beside it is serve's eviction
policy; ``k8s render --ray`` renders this form), or flat beside serve's (``policy`` is then the
routing policy and serve's cannot be set); the environment gives what ``loraplex serve``
reads from it (``LORAPLEX_DATA_DIR``, ``LORAPLEX_DATABASE_URL``, ``LORAPLEX_STORE``,
``LORAPLEX_S3_ENDPOINT``, ``LORAPLEX_ADMIN_KEY``, ``LORAPLEX_SHARED_STATE_URL``), so
credentials stay in the pods' environment.
An unknown key is refused naming it. Across hosts the model directory must be the same path on
every node (in the image or a shared volume) and the registry PostgreSQL with an S3 store.

The ingress listens itself, with loraplex's listener (``listener.py``), on ``host:port`` of the
Ray head node (``deployments.build_app``), as under ``fleet up``: Serve must run no HTTP proxy
(``proxy_location: Disabled`` in the Serve config, as ``deploy/ray.py`` renders it). NOTE: with
Ray's proxy on, it has no HTTP deployment to route to, and on its port (8000 by default, serve's
too) the ingress's listener cannot bind: the ingress replica never starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loraplex.fleet.control import prepare
from loraplex.fleet.deployments import build_app
from loraplex.fleet.settings import FLEET_KEYS, FleetSettings
from loraplex.registry import default_data_dir
from loraplex.serve.config import merge

# serve configuration keys taken from the environment when ``args`` does not give them
ENVIRONMENT_KEYS = {
    "database_url": "LORAPLEX_DATABASE_URL",
    "store": "LORAPLEX_STORE",
    "s3_endpoint": "LORAPLEX_S3_ENDPOINT",
    "admin_key": "LORAPLEX_ADMIN_KEY",
    "shared_state_url": "LORAPLEX_SHARED_STATE_URL",
}


def settings_from_args(args: Mapping[str, Any], environ: Mapping[str, str]) -> FleetSettings:
    """The fleet's settings from ``args`` over the environment over the defaults (prepares the
    model, the demo registration and the admin key, as ``fleet up`` does)."""
    values = dict(args)
    if "fleet" in values:  # the config file's form: every other key is a serve key
        fleet = _fleet_table(values.pop("fleet"))
    else:  # flat: the fleet's keys beside serve's (``policy`` is the routing policy)
        fleet = {name: values.pop(name) for name in FLEET_KEYS if name in values}
    for key, variable in ENVIRONMENT_KEYS.items():
        if key not in values and environ.get(variable):
            values[key] = environ[variable]
    if "data_dir" not in values:
        values["data_dir"] = default_data_dir(environ, Path.home())
    try:
        config = merge(values, {})
    except TypeError as exc:  # an unknown keyword: name the accepted ones
        raise ValueError(f"fleet args: {exc}; expected {FLEET_KEYS} or serve keys") from None
    replicas = fleet.pop("replicas", 2)
    prepared = prepare(config)
    return FleetSettings(
        serve=config, model_dir=prepared.model_dir, engine_replicas=replicas, **fleet
    )


def _fleet_table(table: Any) -> dict[str, Any]:
    """The ``fleet`` arg: the fleet's keys, as the ``[fleet]`` table of ``fleet up --config``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"fleet args: fleet {table!r} is invalid; expected a mapping")
    unknown = sorted(str(key) for key in table if key not in FLEET_KEYS)
    if unknown:
        raise ValueError(f"fleet args: unknown fleet keys {unknown}; expected {FLEET_KEYS}")
    return dict(table)


def build(args: dict[str, Any]) -> Any:
    """The Serve application (Ray Serve's application builder)."""
    return build_app(settings_from_args(args, os.environ))
