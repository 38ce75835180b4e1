"""Architecture rules that a reader should be able to rely on (STYLE.md rule 1)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import loraplex

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCH_FREE = ("registry", "router", "sim")
# Decision code the simulator and the control plane reuse: it must run without torch.
_TORCH_FREE_ADAPTERS = (
    "identity",
    "base_model",
    "manifest",
    "validate",
    "safetensors_header",
    "tensor_values",
    "policy",
    "stats",
    "warm",
    "tiering",
    "pipeline",
    "jobs",
    "cache",
    "cache_flow",
    "cache_view",
    "cache_config",
    "cache_waiters",
    "disk_tier",
    "config_regex",
)
# The engine's decision code (the simulator reuses the scheduler).
_TORCH_FREE_ENGINE = ("protocol", "config", "request", "blocks", "scheduler", "output", "tenancy",
                      "step", "restart")  # fmt: skip
TORCH_FREE_MODULES = (
    *(f"loraplex.adapters.{name}" for name in _TORCH_FREE_ADAPTERS),
    *(f"loraplex.engine.{name}" for name in _TORCH_FREE_ENGINE),
    "loraplex.bench.workloads",
    "loraplex.bench.replay",
    "loraplex.clock",
    "loraplex.errors",
)


def _modules_under(package: str) -> list[str]:
    path = Path(loraplex.__file__).parent / package
    if not path.is_dir():
        return []
    found = [f"loraplex.{package}"]
    for info in pkgutil.walk_packages([str(path)], prefix=f"loraplex.{package}."):
        found.append(info.name)
    return found


def test_control_plane_never_imports_torch() -> None:
    modules = [m for pkg in TORCH_FREE for m in _modules_under(pkg)] + list(TORCH_FREE_MODULES)
    modules = [m for m in modules if _importable(m)]
    assert "loraplex.adapters.identity" in modules
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


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in readme.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2, "README must give exactly two set-up commands"
    assert commands[1] in ci


def _importable(module: str) -> bool:
    relative = module.removeprefix("loraplex.").replace(".", "/")
    root = Path(loraplex.__file__).parent
    return (root / f"{relative}.py").exists() or (root / relative / "__init__.py").exists()
