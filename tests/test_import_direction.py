"""The layers import one way (STYLE.md rule 1): each package names the packages it may import,
and no import, however deep in a function, goes against the arrows. Reading order, bottom up:

    errors, clock, sampling, dtypes,   leaves every layer may use
    devices, background, cpuinfo
    ops, artifacts                     kernels; what an adapter is (identity, validation, store)
    model, registry, residency, demo   the model; the control plane; where copies live
    router                             replica selection, replica reports, the fleet view
    release                            controlled releases (state machine, controller)
    quota                              per-tenant request-rate buckets (local or Redis)
    runtime                            tier backends moving bytes between L3/L2/L1/L0
    engine                             scheduler, runner, engine loop and its process seam
    tracing                            request traces: what the front records, OTLP export
    server                             HTTP only (OpenAI routes, admin API, metrics)
    serve                              the composition root of ``loraplex serve``
    preflight                          the launch checklist, a client over HTTP (leaves only)
    sim                                the simulator over the torch-free decision code
    bench, qualify, plan, cli          benchmarks, qualification, the planner, commands on top
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import loraplex

PACKAGE_ROOT = Path(loraplex.__file__).parent
LEAVES = {"errors", "clock", "sampling", "dtypes", "devices", "background", "cpuinfo", "urls"}
# Benchmarks and commands sit on top: they may use every layer below them.
_BELOW_BENCH = {
    "tracing",
    "serve",
    "server",
    "router",
    "engine",
    "runtime",
    "model",
    "registry",
    "release",
    "quota",
    "residency",
    "artifacts",
    "demo",
    "ops",
}
ALLOWED: dict[str, set[str]] = {
    "ops": set(),
    "artifacts": set(),
    "registry": {"artifacts"},
    "residency": {"artifacts"},
    # The fleet's replica reports and views (``router/fleet_state.py`` reads cache summaries).
    "router": {"residency", "artifacts"},
    "model": {"ops", "artifacts"},
    "demo": {"artifacts"},
    "release": {"registry", "artifacts"},
    "quota": {"registry", "artifacts"},
    "runtime": {"model", "residency", "artifacts"},
    "engine": {"runtime", "model", "residency", "artifacts", "ops"},
    "tracing": {"engine", "residency", "artifacts"},
    "server": {
        "engine",
        "model",
        "registry",
        "release",
        "quota",
        "residency",
        "artifacts",
        "tracing",
        "router",  # the fleet view /admin/fleet shows (``router/fleet_state.py``)
    },
    "serve": _BELOW_BENCH - {"serve"},
    # ``fleet.settings`` (torch- and Ray-free) checks a RayService's [fleet] keys at render time
    "deploy": {"serve", "fleet"},
    "fleet": _BELOW_BENCH,
    # The simulator drives the real torch-free decision code (scheduler, residency, router).
    "sim": {"engine", "residency", "router", "release", "artifacts"},
    "bench": _BELOW_BENCH | {"fleet", "sim"},
    # Qualification runs against a deployment (or starts one with the bench harness).
    "qualify": _BELOW_BENCH | {"bench", "fleet"},
    # The capacity planner: simulated configurations priced per correct request.
    "plan": {"sim", "qualify"},
    "preflight": set(),  # a client of a running deployment: HTTP only
    "__main__": {"cli"},  # `python -m loraplex`: the command, nothing else
    "cli": _BELOW_BENCH | {"bench", "deploy", "fleet", "preflight", "sim", "qualify", "plan"},
}


def _in_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            return True
    return False


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported loraplex module, line, only for type checking) for every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("loraplex"):
            if node.module == "loraplex":
                names = [f"loraplex.{alias.name}" for alias in node.names]
            else:  # `from pkg import submodule` imports the submodule
                names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("loraplex.")]
        else:
            continue
        typing_only = _in_type_checking(node, parents)
        found += [(name, node.lineno, typing_only) for name in names]
    return found


def _package_of(module: str) -> str:
    part = module.split(".")[1]
    return part


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        rel = path.relative_to(PACKAGE_ROOT.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {_package_of(m) for m in _modules() if m != "loraplex"}
    assert packages <= set(ALLOWED) | LEAVES, sorted(packages - set(ALLOWED) - LEAVES)


def test_imports_follow_the_layers() -> None:
    wrong = []
    for module, path in _modules().items():
        if module == "loraplex":
            continue
        source = _package_of(module)
        allowed = LEAVES if source in LEAVES else ALLOWED[source] | LEAVES | {source}
        if source in LEAVES:
            allowed = LEAVES
        for target, line, _ in _imports(path):
            if target == "loraplex":
                continue
            if _package_of(target) not in allowed:
                wrong.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_allowed_graph_has_no_cycle() -> None:
    state: dict[str, int] = {}

    def visit(package: str, trail: tuple[str, ...]) -> None:
        assert state.get(package) != 1, f"package cycle: {' -> '.join((*trail, package))}"
        if state.get(package) == 2:
            return
        state[package] = 1
        for target in ALLOWED.get(package, set()):
            visit(target, (*trail, package))
        state[package] = 2

    for package in ALLOWED:
        visit(package, ())


def test_no_module_import_cycle() -> None:
    """Modules import each other one way too (imports made only for type checking excepted):
    a cycle hidden by a function-local import is still a cycle."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name, _, typing_only in _imports(path):
            target = name
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # `from pkg.mod import name`
            if not typing_only and target != module and target in modules:
                graph[module].add(target)
    cycles = _strongly_connected(graph)
    assert not cycles, "module import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_no_module_cycle_even_for_types() -> None:
    """Issue 26: two files that import each other, even only for type checking, are a class
    split by line count; split by responsibility instead (or keep the class whole). None is
    allowed: the last one (``engine/transport/process.py`` <-> ``remote_cache.py``) is gone."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name, _, _ in _imports(path):
            target = name
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != module and target in modules:
                graph[module].add(target)
    cycles = {tuple(sorted(c)) for c in _strongly_connected(graph)}
    assert cycles == set(), f"module cycles: {sorted(cycles)}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found
