"""A fleet deployed on the local Ray cluster for the tests that run one (``ray_cluster``): the
set-up ``test_fleet_attacks.py`` and ``test_fleet_replica_pins.py`` shared line for line. Import
it after ``pytest.importorskip("ray")``: ``loraplex.fleet.control`` needs Ray."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import pytest

from loraplex.demo.assets import DemoAssets
from loraplex.fleet import control
from loraplex.fleet.ray_cluster import free_port
from loraplex.fleet.settings import FleetSettings
from loraplex.serve.assembly import DEMO_DIR
from loraplex.serve.config import ServeConfig

WAIT_S = 180.0  # for the fleet to answer ready


def deployed(
    stack: ExitStack,
    demo_assets: DemoAssets,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    replicas: int,
    **config: Any,
) -> tuple[control.Prepared, str]:
    """``replicas`` engine replicas and the ingress over the demo assets, deployed as ``loraplex
    fleet up`` does on a fresh Ray Serve (shut down when ``stack`` closes) and ready: what
    ``control.prepare`` made and the fleet's URL. ``config``: the ``ServeConfig`` keys beside a
    data directory of its own (``name``), a free port, one torch thread and no auto-warm (no
    replica pins a revision by its own request rates)."""
    data_dir = tmp_path_factory.mktemp(name)
    (data_dir / DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    from ray import serve

    stack.callback(serve.shutdown)
    serve_config = ServeConfig(
        data_dir=data_dir, port=free_port(), torch_threads=1, auto_warm=False, **config
    )
    prepared = control.prepare(serve_config)
    control.deploy(
        FleetSettings(serve=serve_config, model_dir=prepared.model_dir, engine_replicas=replicas)
    )
    url = control.base_url(serve_config)
    control.wait_ready(url, WAIT_S)
    return prepared, url
