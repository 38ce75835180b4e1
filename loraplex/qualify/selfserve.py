"""``loraplex qualify --self``: a ``loraplex serve`` of its own on a free port (bench harness:
launch, readiness, stop of the process group, log kept under the report directory), serving the
demo assets with ranks up to 128 so the heavy-tail distribution's rank-128 adapters load."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loraplex.bench.harness.process import (
    Launch,
    free_port,
    own_env,
    serve_command,
    serving_process,
)

SELF_MAX_LORA_RANK = 128  # heavy-tail includes rank 128
DEMO_DIR = "demo-assets"  # NOTE: the directory name serve/assembly.py adopts demo assets from
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SelfServer:
    """The running server."""

    url: str  # its base URL
    admin_key: str  # the admin credential it was started with
    log_path: Path  # its output


def ensure_demo_assets(assets_dir: Path, announce: Callable[[Path], None]) -> None:
    """The demo set the server would generate at ``assets_dir``, generated here first (after
    ``announce``) unless it is there. NOTE: the server generated it, inside its
    ``START_TIMEOUT_S`` to ready: from a fresh checkout on a loaded 2-core machine the training
    outlasted it, and ``qualify --self --quick`` stopped with "did not become ready within
    300.0 s" with the set half written."""
    from loraplex.demo.assets import demo_assets_ready, generate_demo_assets
    from loraplex.serve.assembly import DEMO_PRESET, DEMO_SEED  # what the server checks

    if demo_assets_ready(assets_dir.resolve(), DEMO_PRESET, DEMO_SEED):
        return
    announce(assets_dir)
    generate_demo_assets(assets_dir, DEMO_PRESET, DEMO_SEED)


@contextmanager
def self_server(
    assets_dir: Path,
    run_dir: Path,
    torch_threads: int = 1,
    announce: Callable[[Path], None] = lambda _: None,
) -> Iterator[SelfServer]:
    """Serves the demo assets at ``assets_dir`` (generated first, when absent, after
    ``announce``) from a fresh data directory under ``run_dir``."""
    ensure_demo_assets(assets_dir, announce)
    data_dir = run_dir / "self-server"
    data_dir.mkdir(parents=True, exist_ok=True)
    link = data_dir / DEMO_DIR
    if not link.exists():
        link.symlink_to(assets_dir.resolve(), target_is_directory=True)
    port = free_port()
    admin_key = "lpxadmin_" + secrets.token_urlsafe(24)
    command = serve_command(
        "--data-dir", str(data_dir), "--port", str(port), "--admin-key", admin_key,
        "--max-lora-rank", str(SELF_MAX_LORA_RANK), "--threads", str(torch_threads),
    )  # fmt: skip
    env = own_env(PYTHONPATH=os.pathsep.join(sys.path))
    url = f"http://127.0.0.1:{port}"
    log_path = run_dir / "self-server.log"
    launch = Launch("loraplex serve", command, env, url, "/ready", log_path, START_TIMEOUT_S, 20.0)
    with serving_process(launch):
        yield SelfServer(url, admin_key, log_path)
