"""Registration by server path reads nothing outside the import directory (issue 11, item 3).

Each hostile folder is refused with ``UnsafeImportError`` naming the offending relative path,
nothing is registered and no staging copy is left behind; a plain folder still registers.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from registry_kit import AdapterFactory

from loraplex.errors import PathOutsideStoreError, RegistryError, UnsafeImportError
from loraplex.registry import RegistrationRequest, Registry, imports
from loraplex.registry.imports import MAX_IMPORT_ENTRIES, staged_import

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


@pytest.fixture
def staging_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where staging copies go, so a test can see that none is left behind."""
    root = tmp_path / "staging"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def import_dir(tmp_path: Path, make_adapter: AdapterFactory) -> Path:
    """``imports/beta/good``: a plain adapter folder; ``secret/``: files outside the import dir."""
    root = tmp_path / "imports"
    make_adapter("src", seed=4).rename(_parent(root / "beta" / "good"))
    secret = make_adapter("secret", seed=9)
    secret.rename(tmp_path / "secret")
    return root


def _parent(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _copy_of_good(import_dir: Path, name: str) -> Path:
    folder = import_dir / "beta" / name
    folder.mkdir()
    for file in (CONFIG, WEIGHTS):
        (folder / file).write_bytes((import_dir / "beta" / "good" / file).read_bytes())
    return folder


def _symlinked_file(import_dir: Path, secret: Path) -> str:
    folder = _copy_of_good(import_dir, "evil")
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).symlink_to(secret / WEIGHTS)
    return f"beta/evil/{WEIGHTS}"


def _symlinked_subdir(import_dir: Path, secret: Path) -> str:
    folder = _copy_of_good(import_dir, "evil")
    (folder / "extra").symlink_to(secret, target_is_directory=True)
    return "beta/evil/extra"


def _nested_symlink(import_dir: Path, secret: Path) -> str:
    folder = _copy_of_good(import_dir, "evil")
    (folder / "deep" / "er").mkdir(parents=True)
    (folder / "deep" / "er" / "x").symlink_to(secret / CONFIG)
    return "beta/evil/deep/er/x"


def _hard_link(import_dir: Path, secret: Path) -> str:
    folder = _copy_of_good(import_dir, "evil")
    (folder / WEIGHTS).unlink()
    os.link(secret / WEIGHTS, folder / WEIGHTS)
    return f"beta/evil/{WEIGHTS}"


def _fifo(import_dir: Path, secret: Path) -> str:
    folder = _copy_of_good(import_dir, "evil")
    os.mkfifo(folder / "notes")
    return "beta/evil/notes"


HOSTILE: dict[str, Callable[[Path, Path], str]] = {
    "symlinked file": _symlinked_file,
    "symlinked subdir": _symlinked_subdir,
    "symlink at depth": _nested_symlink,
    "hard link": _hard_link,
    "fifo": _fifo,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_folders_are_refused_and_nothing_is_registered(
    registry: Registry, import_dir: Path, staging_root: Path, tmp_path: Path, kind: str
) -> None:
    registry.create_tenant("beta", "ops")
    offending = HOSTILE[kind](import_dir, tmp_path / "secret")

    with pytest.raises(UnsafeImportError) as info, staged_import(import_dir, "beta/evil") as staged:
        registry.register(RegistrationRequest(staged, "beta", "stolen", "v1"), "ops")

    assert repr(offending) in str(info.value)
    assert registry.list_adapters("beta") == []
    assert list(staging_root.iterdir()) == []


@pytest.mark.parametrize(
    ("relative", "offending"), [("beta/evil", "beta/evil"), ("alias/good", "alias")]
)
def test_a_linked_folder_or_parent_is_refused(
    import_dir: Path, staging_root: Path, tmp_path: Path, relative: str, offending: str
) -> None:
    (import_dir / "beta" / "evil").symlink_to(tmp_path / "secret", target_is_directory=True)
    (import_dir / "alias").symlink_to(import_dir / "beta", target_is_directory=True)
    with (
        pytest.raises(UnsafeImportError, match=f"'{offending}' is a symbolic link"),
        staged_import(import_dir, relative),
    ):
        pass
    assert list(staging_root.iterdir()) == []


@pytest.mark.parametrize("relative", ["../secret", "/etc", "beta/../../secret"])
def test_paths_leaving_the_import_directory_are_refused(import_dir: Path, relative: str) -> None:
    with (
        pytest.raises(PathOutsideStoreError, match="inside the import directory"),
        staged_import(import_dir, relative),
    ):
        pass


def test_a_missing_folder_is_a_clear_error(import_dir: Path) -> None:
    with (
        pytest.raises(RegistryError, match="'beta/nothing' is invalid; expected a directory"),
        staged_import(import_dir, "beta/nothing"),
    ):
        pass


def test_a_folder_with_too_many_entries_is_refused(import_dir: Path) -> None:
    folder = _copy_of_good(import_dir, "crowded")
    for index in range(MAX_IMPORT_ENTRIES):
        (folder / f"f{index}").touch()
    with (
        pytest.raises(UnsafeImportError, match=f"more than {MAX_IMPORT_ENTRIES} entries"),
        staged_import(import_dir, "beta/crowded"),
    ):
        pass


def test_a_plain_folder_registers_from_its_private_copy(
    registry: Registry, import_dir: Path, staging_root: Path
) -> None:
    registry.create_tenant("beta", "ops")
    source = import_dir / "beta" / "good"
    (source / "README.md").write_text("notes")
    (source / "sub").mkdir()
    (source / "sub" / "log.txt").write_text("x")

    with staged_import(import_dir, "beta/good") as staged:
        copied = {p.name: p.read_bytes() for p in staged.iterdir()}
        modes = {stat.S_IMODE(p.stat().st_mode) for p in staged.iterdir()}
        result = registry.register(RegistrationRequest(staged, "beta", "good", "v1"), "ops")

    assert result.created and registry.resolve("beta", "good").name == "good"
    for name in (CONFIG, WEIGHTS):
        assert copied[name] == (source / name).read_bytes()
    assert copied["README.md"] == b"" and copied["sub"] == b""  # mirrored by name only
    assert modes == {0o600}
    assert list(staging_root.iterdir()) == []


def test_a_file_swapped_for_a_link_after_the_check_is_not_followed(
    import_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy_of_good(import_dir, "racy")
    checked = imports._check_tree

    def check_then_swap(fd: int, where: str) -> list[str]:
        names = checked(fd, where)
        (folder / WEIGHTS).unlink()
        (folder / WEIGHTS).symlink_to(tmp_path / "secret" / WEIGHTS)
        return names

    monkeypatch.setattr(imports, "_check_tree", check_then_swap)
    with (
        pytest.raises(UnsafeImportError, match=f"'beta/racy/{WEIGHTS}' is a symbolic link"),
        staged_import(import_dir, "beta/racy"),
    ):
        pass
