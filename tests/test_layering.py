"""Architecture rules that a reader should be able to rely on (STYLE.md rule 1)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import loraplex

REPO_ROOT = Path(__file__).resolve().parent.parent
# Whole packages that never import torch: the control plane, what an adapter is, where it lives
# (the decision code a simulator would reuse) and the HTTP layer. This checks packages; the HTTP
# process is checked by its entry modules (FRONT_MODULES, below) and, running, by
# tests/server/test_front_torch_free.py.
# A package not (yet) in the tree fails the test rather than passing with no modules.
TORCH_FREE = (
    "registry",
    "release",
    "quota",
    "artifacts",
    "residency",
    "server",
    "router",
    "deploy",
    "preflight",
    "tracing",
    "sim",
    "plan",
    "qualify",  # a client of the deployment; the offline references import torch lazily
)
# The engine's decision code (the simulator reuses the scheduler).
_TORCH_FREE_ENGINE = (
    "protocol",
    "config",
    "request",
    "kv",
    "kv.blocks",
    "sched",
    "sched.scheduler",
    "sched.planner",
    "sched.request_book",
    "sched.step_share",
    "sched.admission",
    "sched.fair_order",
    "sched.stats",
    "output",
    "tenant_shares",
    "step",
    "loop",
    # the transport the HTTP process runs (the engine child's builder imports torch, there)
    "transport",
    "transport.restart",
    "transport.messages",
    "transport.process_state",
    "transport.remote_cache",
    "transport.process",
    "transport.process_gate",
    "transport.process_supervisor",
    "transport.process_link",
    "transport.process_inflight",
    "transport.process_replay",
    "transport.process_child",
    "transport.child_loop",
    "transport.cache_commands",
    "transport.packed_errors",
    "transport.worker",
    "transport.streams",
    "transport.thread_client",
    "trace_log",
    "mode_policy",
    "live",
    "lease_desk",
    "mode_report",
)
TORCH_FREE_MODULES = (
    *(f"loraplex.engine.{name}" for name in _TORCH_FREE_ENGINE),
    "loraplex.runtime.disk_tier",
    "loraplex.bench.workloads",
    "loraplex.bench.replay",
    "loraplex.clock",
    "loraplex.errors",
    "loraplex.sampling",
)


# What the HTTP process of ``loraplex serve`` (engine process) and a fleet's ingress import: the
# command, the assembly and front, the engine process client, and the fleet's ingress and
# deployments (Ray imports the latter in the ingress's and the board's processes).
FRONT_MODULES = (
    "loraplex.cli",
    "loraplex.cli.serve",
    "loraplex.serve.assembly",
    "loraplex.serve.front",
    "loraplex.serve.worker",
    "loraplex.engine.transport.process",
    "loraplex.fleet.ingress",
    "loraplex.fleet.deployments",
)


def _modules_under(package: str) -> list[str]:
    path = Path(loraplex.__file__).parent / package
    if not path.is_dir():
        raise AssertionError(f"TORCH_FREE names {package!r}, which is not a package of loraplex")
    found = [f"loraplex.{package}"]
    for info in pkgutil.walk_packages([str(path)], prefix=f"loraplex.{package}."):
        found.append(info.name)
    return found


def test_control_plane_never_imports_torch() -> None:
    modules = [m for pkg in TORCH_FREE for m in _modules_under(pkg)] + list(TORCH_FREE_MODULES)
    missing = [m for m in TORCH_FREE_MODULES if not _importable(m)]
    assert not missing, f"listed as torch-free but not a module: {missing}"
    modules = [m for m in modules if _importable(m)]
    assert "loraplex.artifacts.identity" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(','.join(leaked[:3]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert result.stdout.strip() == "", f"torch imported by {modules}: {result.stdout}"


def test_the_front_process_modules_never_import_torch() -> None:
    """Item 1 of issue 26: the HTTP process's own imports, each in a fresh interpreter (one
    module's import must not hide another's by loading it first)."""
    missing = [m for m in FRONT_MODULES if not _importable(m)]
    assert not missing, f"listed as front modules but not modules: {missing}"
    code = (
        "import importlib, sys\n"
        "importlib.import_module(sys.argv[1])\n"
        "print('torch' in sys.modules)\n"
    )

    def torch_loaded(module: str) -> bool:
        result = subprocess.run(
            [sys.executable, "-c", code, module],
            capture_output=True, text=True, check=True, cwd=REPO_ROOT,
        )  # fmt: skip
        return result.stdout.strip() != "False"

    # The interpreters are independent: run side by side (the imports are most of this test).
    with ThreadPoolExecutor(max_workers=4) as pool:
        loaded = list(pool.map(torch_loaded, FRONT_MODULES))
    leaked = [m for m, hit in zip(FRONT_MODULES, loaded, strict=True) if hit]
    assert not leaked, f"torch imported by the front process's modules: {leaked}"


def _setup_commands_by_section(readme: str) -> dict[str, list[str]]:
    """README section title -> its set-up commands (lines starting ``python3 -m venv``)."""
    sections: dict[str, list[str]] = {}
    title = ""
    for line in readme.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
        elif line.startswith("python3 -m venv"):
            sections.setdefault(title, []).append(line.strip())
    return sections


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    sections = _setup_commands_by_section(readme)
    # Exactly two for the server (run, test), and a fleet's own two beside them.
    assert set(sections) == {"Two commands", "A fleet: many engine replicas on Ray Serve"}
    assert all(len(commands) == 2 for commands in sections.values()), sections
    assert sections["Two commands"][1] in ci
    fleet_run, fleet_test = sections["A fleet: many engine replicas on Ray Serve"]
    assert "fleet up" in fleet_run and "pytest" in fleet_test


def _importable(module: str) -> bool:
    relative = module.removeprefix("loraplex.").replace(".", "/")
    root = Path(loraplex.__file__).parent
    return (root / f"{relative}.py").exists() or (root / relative / "__init__.py").exists()
