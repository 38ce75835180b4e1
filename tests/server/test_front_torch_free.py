"""The HTTP process of a running ``loraplex serve`` (engine in its own process, the default) loads
no torch: after it has served a completion, its memory map (``/proc/PID/maps``, read from outside,
no endpoint involved) holds no ``libtorch``, while its engine child's does."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import httpx
import pytest

from loraplex.bench.front.probe import mapped_libraries, torch_mapped
from loraplex.bench.harness.process import Launch, free_port, serving_process
from loraplex.bench.proc_tree import engine_child
from loraplex.demo.assets import DemoAssets
from loraplex.serve.assembly import DEMO_DIR

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]
REPO_ROOT = Path(__file__).resolve().parents[2]
_SERVE = "from loraplex.cli import main; main()"  # run with -P: the checkout, not the cwd


def _launch(data_dir: Path, admin: str) -> Launch:
    port = free_port()
    flags = ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    flags += ["--admin-key", admin, "--engine-process", "--threads", "1"]
    return Launch(
        name="loraplex serve",
        command=[sys.executable, "-P", "-c", _SERVE, "serve", *flags],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        url=f"http://127.0.0.1:{port}",
        ready_path="/ready",
        log_path=data_dir.parent / "server.log",
        start_timeout_s=300.0,
        stop_grace_s=30.0,
    )


def test_the_serving_http_process_never_maps_torch(demo_assets: DemoAssets, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    admin = "lpxadmin_" + secrets.token_urlsafe(24)
    launch = _launch(data_dir, admin)
    with serving_process(launch) as process, httpx.Client(base_url=launch.url, timeout=120) as http:
        made = http.post("/admin/tenants/acme/keys", headers={"Authorization": f"Bearer {admin}"})
        assert made.status_code == 201, made.text
        body = {"model": "support", "prompt": "The acme support team", "max_tokens": 4}
        token = made.json()["token"]
        answer = http.post(
            "/v1/completions", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] > 0
        engine = engine_child(process.pid)
        assert not torch_mapped(process.pid), mapped_libraries(process.pid, "torch")
        assert torch_mapped(engine)  # the probe sees torch where it is: in the engine child
