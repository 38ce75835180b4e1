"""docs/architecture.md names code that exists where it says: every file of its start-up and
request walk-through and of its other prose sections (packages, identity, validation, costs,
releases), every ``module.name``, ``Class.method`` and ``Class.field.method`` there, every
"``file``: ``name``" pair, and module maps (``engine/``, ``residency/cache/``) that list each
file once and no file that is gone. A file moved or a function renamed without the doc fails
here. The module maps' rename history ("was ``peer_loraplex.py``") names files that are gone on
purpose and is not walked."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "loraplex"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
WALKED = (
    "Packages, bottom up",
    "Start-up",
    "A request, stage by stage",
    "Identity: an adapter is its bytes on its base",
    "Validation happens before any memory is reserved",
    "Costs that do not grow with what is cached",
    "Releases",
)
NOT_CODE = ("py", "md", "json", "safetensors")  # ``adapter_model.safetensors``: a file name
_TICKED = re.compile(r"`([^`]+)`")
NOT_OURS = {"F"}  # torch.nn.functional


def _section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end >= 0 else len(DOC)]


WALK = "\n".join(_section(title) for title in WALKED)
FILES = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py"))


def _resolve(path: str) -> list[str]:
    """The package files ``path`` may name: itself under ``loraplex/``, else every file (or
    folder) whose path ends with it (``sched/planner.py`` is ``engine/sched/planner.py``); a
    test's path is the repository's."""
    path = path.removeprefix("loraplex/").rstrip("/")
    if (PKG / path).exists() or (path.startswith("tests/") and (ROOT / path).exists()):
        return [path]
    return [f for f in FILES if f.endswith(f"/{path}") or f"/{path}/" in f"/{f}"]


def _file(path: str) -> Path:
    """A path ``_resolve`` gave: the package's, or a test's (the repository's)."""
    return ROOT / path if path.startswith("tests/") else PKG / path


@cache
def _tree(path: str) -> ast.Module:
    return ast.parse(_file(path).read_text(encoding="utf-8"))


def _defined(path: str) -> set[str]:
    """Names a file defines anywhere: functions, classes, methods, assigned names."""
    names: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@cache
def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Class name -> (its own methods and fields, its bases' names), per definition."""
    found: dict[str, list[tuple[set[str], list[str]]]] = {}
    for path in FILES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                own = _defined_in_body(node)
                bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                found.setdefault(node.name, []).append((own, bases))
    return found


def _defined_in_body(node: ast.ClassDef) -> set[str]:
    names = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    return names


def _has_member(cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
    for own, bases in _classes().get(cls, []):
        if member in own:
            return True
        if any(_has_member(b, member, seen | {cls}) for b in bases if b not in seen):
            return True
    return False


def _module_has(module: str, name: str) -> bool:
    return any(name in _defined(f) for f in _resolve(f"{module}.py") + _package_files(module))


def _package_files(module: str) -> list[str]:
    return [f for f in FILES if f"/{module}/" in f"/{f}"]


def _field_types(cls: str) -> dict[str, str]:
    """A class's annotated fields (its bases' too) -> the annotation's class name."""
    types: dict[str, str] = {}
    for path in FILES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id != cls:
                        types = _field_types(base.id) | types
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        types[item.target.id] = ast.unparse(item.annotation)
    return types


def test_every_walked_field_call_exists() -> None:
    """``Class.field.method`` (``ServerDeps.admin.current()``): the field is annotated on the
    class, and its type has the method."""
    refs = {r for r in _TICKED.findall(WALK) if re.fullmatch(r"[A-Z]\w*\.\w+\.\w+(\(\))?", r)}
    assert refs  # the walk names one at least
    missing = []
    for ref in refs:
        cls, field, method = ref.removesuffix("()").split(".")
        kind = _field_types(cls).get(field)
        if kind is None or not _has_member(kind, method):
            missing.append(ref)
    assert sorted(missing) == []


def test_every_walked_file_exists() -> None:
    paths = {t for t in _TICKED.findall(WALK) if re.fullmatch(r"[\w/]+\.py|[a-z_]+(/[a-z_]+)*/", t)}
    assert len(paths) > 50  # the walk-through was read
    assert sorted(p for p in paths if not _resolve(p)) == []


def test_every_walked_name_exists() -> None:
    """``module.name`` (``serving.prepare``), ``dir/module.name`` (``ops/policy.AutoPolicy``) and
    ``Class.method`` (``Scheduler.lease_candidates``, found on the class or a base)."""
    missing = []
    for ref in set(_TICKED.findall(WALK)):
        match = re.fullmatch(r"([\w/]+)\.(\w+)(?:\(\))?", ref)
        if match is None or match.group(2) in NOT_CODE:
            continue
        owner, name = match.groups()
        if owner in NOT_OURS:
            continue
        found = _has_member(owner, name) if owner[0].isupper() else _module_has(owner, name)
        if not found:
            missing.append(ref)
    assert sorted(missing) == []


def test_every_file_name_pair_is_where_it_says() -> None:
    """A "`file.py`: `name`", "`file.py: name`" or "`Class.method` (`file.py`" pair: the name
    is in that file."""
    pairs = re.findall(r"`([\w/]+\.py)`?:\s+`(?:\w+\.)?(\w+)(?:\(\))?`", WALK)
    pairs += [(f, n) for n, f in re.findall(r"`\w+\.(\w+)` \(`([\w/]+\.py)`", WALK)]
    pairs += re.findall(r"`([\w/]+\.py): (\w+)`", WALK)
    assert len(pairs) >= 5
    wrong = [(f, n) for f, n in pairs if not any(_names(p, n) for p in _resolve(f))]
    assert wrong == []


def _names(path: str, name: str) -> bool:
    """``path`` defines ``name``, or registers it by that string (a policy's name)."""
    return name in _defined(path) or f'"{name}"' in _file(path).read_text(encoding="utf-8")


def _has_code(path: Path) -> bool:
    """More than a docstring (``engine/__init__.py`` is one: nothing to map)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return not (len(body) <= 1 and all(isinstance(n, ast.Expr) for n in body))


@pytest.mark.parametrize(
    ("heading", "package"),
    [("`engine/`, by stage", "engine"), ("`residency/cache/`", "residency/cache")],
)
def test_module_map_lists_every_file(heading: str, package: str) -> None:
    start = DOC.index(f"\n### {heading}\n")
    end = DOC.find("\n#", start + 1)
    listed = re.findall(r"^\| `([\w/]+\.py)` \|", DOC[start:end], flags=re.M)
    assert len(listed) == len(set(listed)), "a file is listed twice"
    files = {p.relative_to(PKG / package).as_posix(): p for p in (PKG / package).rglob("*.py")}
    unlisted = {name for name, path in files.items() if _has_code(path)} - set(listed)
    assert unlisted == set(), f"{package} files missing from the module map"
    assert set(listed) - set(files) == set(), f"the {package} module map lists files that are gone"


def test_packages_are_listed_bottom_up() -> None:
    """ "Packages, bottom up": every package of ``ALLOWED`` is a row, and each may import only
    packages in rows above its own."""
    from test_import_direction import ALLOWED, LEAVES

    table = _section("Packages, bottom up").split("\n\n")[2]
    order: list[str] = []
    for row in table.splitlines()[2:]:
        first = row.strip("|").split(" | ")[0]
        order += [Path(n).stem for n in re.findall(r"`([\w.]+)/?`", first)]
    packages = set(ALLOWED) - {"__main__"}
    assert set(order) == packages | LEAVES
    late = {p: q for p in packages for q in ALLOWED[p] if order.index(q) > order.index(p)}
    assert late == {}, "a package imports one listed below it"


def test_the_torch_free_packages_are_test_layerings() -> None:
    from test_layering import TORCH_FREE

    sentence = _section("Packages, bottom up").split("never import torch")[0].split("\n\n")[-1]
    named = {p.rstrip("/") for p in _TICKED.findall(sentence) if re.fullmatch(r"[a-z]+/", p)}
    assert named == set(TORCH_FREE)
