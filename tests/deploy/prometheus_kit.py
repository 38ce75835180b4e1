"""A real Prometheus (Debian's ``prometheus`` package) and a real loraplex server for the
end-to-end alert and dashboard tests.

The shipped rules use production windows (``[10m]``) and ``for:`` durations (``10m``); an alert
test cannot wait that long, so ``render_rules`` rewrites every range window and every ``for:`` to
test-time values and leaves the expressions and thresholds as shipped. Prometheus runs on a free
local port with its own config, data directory and 1 s scrape and evaluation intervals, and is
stopped (and waited for) when the block ends.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from loraplex.demo.assets import DemoAssets
from loraplex.serve.assembly import DEMO_DIR, build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.front import Server
from loraplex.server.listeners import ConnectionLimits, ListenerConfig, bind

PROMETHEUS = shutil.which("prometheus")
REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "loraplex-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "loraplex.json"
_RANGE = re.compile(r"\[\d+[smhd]\]")


def render_rules(text: str, window: str, hold: str) -> str:
    """The rules of ``text`` with every range window ``[..]`` set to ``window`` and every
    ``for:`` to ``hold`` (expressions and thresholds unchanged)."""
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _RANGE.sub(f"[{window}]", rule["expr"])
            if "for" in rule:
                rule["for"] = hold
    return yaml.safe_dump(doc, sort_keys=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Target:
    """One scrape job: ``host:port`` with an optional bearer credential."""

    job: str
    address: str
    bearer: str | None = None


@dataclass(frozen=True)
class Prometheus:
    """A running Prometheus's HTTP API."""

    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now (/api/v1/query); raises on an API error."""
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert reply["status"] == "success", (expr, reply)
        result: list[dict[str, Any]] = reply["data"]["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending or firing) from /api/v1/alerts."""
        reply = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        alerts: list[dict[str, Any]] = reply["data"]["alerts"]
        return alerts

    def state(self, name: str, **labels: str) -> str:
        """``firing``, ``pending`` or ``inactive`` (not in the active list) of one alert."""
        for alert in self.alerts():
            mine = alert["labels"]
            if mine["alertname"] == name and all(mine.get(k) == v for k, v in labels.items()):
                return str(alert["state"])
        return "inactive"


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.5
) -> float:
    """Polls ``check`` until true; returns the seconds it took; fails naming ``what``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what} not within {timeout_s} s"
        time.sleep(every_s)
    return time.monotonic() - started


def _config(targets: list[Target], rules: Path) -> dict[str, Any]:
    jobs = []
    for target in targets:
        job: dict[str, Any] = {
            "job_name": target.job,
            "static_configs": [{"targets": [target.address]}],
        }
        if target.bearer is not None:
            job["authorization"] = {"type": "Bearer", "credentials": target.bearer}
        jobs.append(job)
    intervals = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    return {"global": intervals, "rule_files": [str(rules)], "scrape_configs": jobs}


@contextmanager
def running_prometheus(work: Path, targets: list[Target], rules_text: str) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` with ``rules_text`` until the block ends."""
    assert PROMETHEUS is not None
    work.mkdir(parents=True, exist_ok=True)
    rules = work / "rules.yml"
    rules.write_text(rules_text)
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(_config(targets, rules)))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: _ready(prom, process), 30, "Prometheus ready", every_s=0.2)
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _ready(prom: Prometheus, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "Prometheus exited (see prometheus.log in the test's tmp dir)"
    try:
        return httpx.get(f"{prom.url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class Served:
    """An assembled ``loraplex serve`` listening on a free local port."""

    server: Server
    url: str  # base URL
    address: str  # host:port, for a scrape target


@contextmanager
def serving(assets: DemoAssets, data_dir: Path, **config: Any) -> Iterator[Served]:
    """``build_server`` on ``data_dir`` (the session's demo set adopted, not generated again),
    served by uvicorn on its own thread until the block ends."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / DEMO_DIR).symlink_to(assets.root, target_is_directory=True)
    server = build_server(ServeConfig(data_dir=data_dir, **config))
    sock = bind("127.0.0.1", 0)
    web = uvicorn.Server(ListenerConfig(server.app, ConnectionLimits(), log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: web.started, 30, "uvicorn started", every_s=0.01)
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        yield Served(server, f"http://{address}", address)
    finally:
        web.should_exit = True
        thread.join(timeout=30)
        sock.close()
        server.close()
