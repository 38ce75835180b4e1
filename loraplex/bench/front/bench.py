"""``loraplex bench front``: what the HTTP process of ``loraplex serve`` costs to start and to hold.

Each run starts a real ``loraplex serve`` (the demo defaults, its engine in a child process,
one torch thread) from one source tree, in a fresh data directory that adopts the generated demo
set, and records, on one clock from the launch: when ``/health`` first answers 200 (the front is
listening: its own imports and assembly) and when ``/ready`` does (the engine child is up too).
After one completion it reads, from ``/proc`` and without asking the server, the HTTP process's
resident memory (now and peak), whether torch's library is mapped into it, and the engine
child's resident memory. Several trees (a checkout before and after a change) run alternately
(ABBA), so drift and warm-up fall on both alike; a failed run counts and is kept with its error.
Every run's log and data directory stay under the report directory.
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.front.probe import memory_of, torch_mapped
from loraplex.bench.harness.machine import machine_record
from loraplex.bench.harness.order import run_order
from loraplex.bench.harness.process import (
    Launch,
    free_port,
    fresh_run_dir,
    own_env,
    serving_process,
)
from loraplex.bench.harness.stats import ratio
from loraplex.bench.proc_tree import engine_child

DEMO_DIR = "demo-assets"  # where ``loraplex serve`` looks for its demo set under its data dir
POLL_S = 0.02  # how often /health and /ready are asked while the server starts
_MIB = 1 << 20
# ``loraplex serve`` as a script; run with -P so the current directory never shadows the tree.
_SERVE = "from loraplex.cli import main; main()"


@dataclass(frozen=True)
class Tree:
    """One side: a checkout whose ``loraplex/`` the server runs (its PYTHONPATH)."""

    name: str  # the side's name in the report ("before", "after")
    root: Path  # the checkout's root directory

    def __post_init__(self) -> None:
        if not (self.root / "loraplex" / "__init__.py").is_file():
            raise ValueError(f"tree {self.name}={self.root} is invalid; expected a checkout root")


@dataclass(frozen=True)
class FrontBenchConfig:
    trees: tuple[Tree, ...]  # the sides, run alternately
    report_dir: Path  # each invocation's run directory (logs, data) is made under it, kept
    asset_dir: Path = Path(".loraplex-assets")  # the demo set is <dir>/test-small (made if absent)
    runs: int = 3  # per tree
    max_tokens: int = 8  # of the one completion each run serves
    start_timeout_s: float = 600.0  # launch to /ready
    extra_args: tuple[str, ...] = field(default=())  # more ``loraplex serve`` flags, every run

    def __post_init__(self) -> None:
        if not self.trees:
            raise ValueError("trees () is invalid; expected at least one NAME=PATH")
        names = [tree.name for tree in self.trees]
        if len(set(names)) != len(names):
            raise ValueError(f"trees {names} is invalid; expected distinct names")
        for name in ("runs", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if not self.start_timeout_s > 0:
            raise ValueError(f"start_timeout_s {self.start_timeout_s} is invalid; expected > 0")


def run_front_bench(config: FrontBenchConfig) -> dict[str, Any]:
    """Every run in the order taken, the per-tree summary and the later tree over the first."""
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir / "test-small", preset="small", seed=0)
    root = fresh_run_dir(config.report_dir, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    runs = []
    for number, (_, side) in enumerate(run_order([len(config.trees)], config.runs)):
        tree = config.trees[side]
        run_path = root / f"{number:02d}-{tree.name}"
        runs.append({"tree": tree.name, **_one_run(tree, assets.root, run_path, config)})
    summary = {
        tree.name: _summary([r for r in runs if r["tree"] == tree.name]) for tree in config.trees
    }
    return {
        "name": "front_process",
        "config": {
            "trees": {
                t.name: {"root": str(t.root), "commit": _commit(t.root)} for t in config.trees
            },
            "runs": config.runs,
            "max_tokens": config.max_tokens,
            "extra_args": list(config.extra_args),
        },
        "summary": summary,
        "ratios": _ratios(config.trees, summary),
        "runs": runs,
        "run_dir": str(root),
        "machine": machine_record(),
    }


def _one_run(
    tree: Tree, demo_root: Path, run_path: Path, config: FrontBenchConfig
) -> dict[str, Any]:
    data_dir = run_path / "data"
    data_dir.mkdir(parents=True)
    (data_dir / DEMO_DIR).symlink_to(demo_root, target_is_directory=True)
    port, admin = free_port(), "lpxadmin_" + secrets.token_urlsafe(24)
    flags = ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    flags += ["--admin-key", admin, "--engine-process", "--threads", "1", *config.extra_args]
    launch = Launch(
        name=f"loraplex serve ({tree.name})",
        command=[sys.executable, "-P", "-c", _SERVE, "serve", *flags],
        env=own_env(PYTHONPATH=str(tree.root.resolve())),
        url=f"http://127.0.0.1:{port}",
        ready_path="/health",
        log_path=run_path / "server.log",
        start_timeout_s=config.start_timeout_s,
        stop_grace_s=30.0,
        poll_s=POLL_S,
    )
    record: dict[str, Any] = {"ok": False, "load_1m_at_start": round(os.getloadavg()[0], 2)}
    started = time.perf_counter()
    try:
        with serving_process(launch) as process:
            record["start_to_health_s"] = round(time.perf_counter() - started, 3)
            _wait_ready(launch.url, started + config.start_timeout_s)
            record["start_to_ready_s"] = round(time.perf_counter() - started, 3)
            _complete(launch.url, admin, config.max_tokens)
            record.update(_holdings(process.pid), ok=True)
    except (RuntimeError, httpx.HTTPError, OSError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:500]
    return record


def _wait_ready(url: str, deadline: float) -> None:
    while time.perf_counter() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"{url}/ready did not answer 200 before the start timeout")


def _complete(url: str, admin: str, max_tokens: int) -> None:
    """One completion through an API key the admin API issues (demo tenant acme)."""
    with httpx.Client(base_url=url, timeout=120.0) as client:
        made = client.post("/admin/tenants/acme/keys", headers={"Authorization": f"Bearer {admin}"})
        made.raise_for_status()
        body = {"model": "support", "prompt": "The acme support team", "max_tokens": max_tokens}
        headers = {"Authorization": f"Bearer {made.json()['token']}"}
        answer = client.post("/v1/completions", json={**body, "temperature": 0}, headers=headers)
        answer.raise_for_status()
        if not answer.json()["choices"][0]["text"]:
            raise RuntimeError("the completion came back empty")


def _holdings(pid: int) -> dict[str, Any]:
    """What the HTTP process and its engine child hold now."""
    front, engine = memory_of(pid), memory_of(engine_child(pid))
    return {
        "front_rss_mib": round(front.rss_bytes / _MIB, 1),
        "front_peak_rss_mib": round(front.peak_rss_bytes / _MIB, 1),
        "front_torch_mapped": torch_mapped(pid),
        "engine_rss_mib": round(engine.rss_bytes / _MIB, 1),
    }


_MEASURES = (
    "start_to_health_s",
    "start_to_ready_s",
    "front_rss_mib",
    "front_peak_rss_mib",
    "engine_rss_mib",
)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians with min-max over the runs that completed; failures counted."""
    done = [r for r in runs if r["ok"]]
    out: dict[str, Any] = {"runs": len(runs), "failed": len(runs) - len(done)}
    for name in _MEASURES:
        values = [r[name] for r in done]
        out[name] = _median_range(values)
    out["front_torch_mapped"] = sorted({r["front_torch_mapped"] for r in done})
    return out


def _median_range(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def _ratios(trees: tuple[Tree, ...], summary: dict[str, Any]) -> dict[str, Any]:
    """The last tree's medians over the first's (null when either is missing, never 0)."""
    if len(trees) < 2:
        return {}
    first, last = summary[trees[0].name], summary[trees[-1].name]
    key = f"{trees[-1].name}_over_{trees[0].name}"
    return {name: {key: ratio(_median(last[name]), _median(first[name]))} for name in _MEASURES}


def _median(measure: dict[str, float] | None) -> float | None:
    return None if measure is None else measure["median"]


def _commit(root: Path) -> str | None:
    """The tree's commit, marked ``+dirty`` with uncommitted changes; None outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")
