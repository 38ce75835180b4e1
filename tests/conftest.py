"""Shared fixtures: the generated small demo model and adapters, built once per checkout.

The assets are cached under ``<repo>/.loraplex-assets`` (git-ignored); the generator itself
returns at once when a complete set with the same preset and seed is already there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# NOTE: Triton reads TRITON_INTERPRET once, when it is first imported, and peft imports it on
# its own; the Triton kernels are tested on CPU tensors through its interpreter
# (tests/ops/test_triton_backend.py), so it is set before any test module is collected.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Builders of adapter files byte by byte, and their fixtures, for every package's tests; the
# local Ray cluster the fleet tests share.
pytest_plugins = ["adapter_builders", "ray_cluster"]

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSET_CACHE = REPO_ROOT / ".loraplex-assets"


@pytest.fixture(autouse=True)
def _loraplex_logger_as_it_was() -> Iterator[None]:
    """A command run in-process (``serve``, ``fleet up`` through CliRunner) configures the
    ``loraplex`` logger (``serve/logs.py``: its own handler, no propagation); put back after
    each test, so that ``caplog`` still sees the lines of later tests."""
    logger = logging.getLogger("loraplex")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture(scope="session")
def demo_assets() -> DemoAssets:
    from loraplex.demo.assets import generate_demo_assets

    return generate_demo_assets(ASSET_CACHE / "test-small", preset="small", seed=0)


@pytest.fixture(scope="session")
def reduced_demo_assets(tmp_path_factory: pytest.TempPathFactory) -> DemoAssets:
    """The reduced ``small`` set of seed 0 (tests/reduced_demo.py), generated once per session
    for the tests that check the generator itself (not cached: they check a fresh generation)."""
    from reduced_demo import generate_reduced

    return generate_reduced(tmp_path_factory.mktemp("reduced") / "seed0", "small", 0)


# The test modules that start a Ray cluster: the shared ``ray_cluster`` fixture, or a command
# that starts its own (marked ``ray``). Checked at collection (below).
RAY_MODULES = frozenset(
    {
        "tests/bench/test_bench_fleet.py",
        "tests/bench/test_bench_fleet_topology.py",
        "tests/fleet/test_board_store.py",
        "tests/fleet/test_fleet_attacks.py",
        "tests/fleet/test_fleet_e2e.py",
        "tests/fleet/test_fleet_placement.py",
        "tests/fleet/test_fleet_record.py",
        "tests/fleet/test_fleet_replica_pins.py",
        "tests/fleet/test_fleet_up_cli.py",
        "tests/preflight/test_preflight_fleet.py",
    }
)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n`` (the README's test command) a worker takes a whole test module, which its
    module-scoped fixtures (a live server, a pool) and tests that build on the one before
    expect; and every module of ``RAY_MODULES`` goes to one worker, one after another: two
    fleets at once on a 2-core machine starve each other's replicas.

    NOTE: xdist's own ``--dist loadgroup`` would do this from marks, but with pytest 9.2 its
    renaming of node ids no longer takes, and every test is sent on its own. The ``--dist``
    modes that split a run by load (``load``, the default with ``-n``, ``loadscope``,
    ``loadfile``, ``loadgroup``) all get this one; ``each`` and ``worksteal`` stay xdist's."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndRay(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "ray" if module in RAY_MODULES else module

    return ModulesAndRay(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts a Ray cluster is in a module of ``RAY_MODULES``; GPU tests skip
    cleanly on machines without CUDA."""
    for item in items:
        uses_ray = item.get_closest_marker("ray") or "ray_cluster" in getattr(
            item, "fixturenames", ()
        )
        module = item.nodeid.split("::", 1)[0]
        if uses_ray and module not in RAY_MODULES:
            raise pytest.UsageError(
                f"{item.nodeid} starts a Ray cluster: add {module} to RAY_MODULES "
                "(tests/conftest.py), so that one xdist worker runs the Ray tests"
            )
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
