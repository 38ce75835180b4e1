"""Registration by server path: a private copy of an adapter folder under the import directory.

Whoever can write the import directory must not be able to read anything else through it
(another tenant's stored artifacts above all). So the folder is read as a hostile tree:

- each path component below the import directory is opened with ``O_NOFOLLOW`` relative to its
  parent's descriptor (no ``..``, no absolute path, no link anywhere on the way);
- every entry at every depth of the folder must be a directory or a regular file with one link:
  a symlink, a hard link (``st_nlink > 1``) or a fifo, socket or device is refused, since each
  can show bytes from elsewhere;
- the two PEFT files are opened ``O_NOFOLLOW``, checked with ``fstat`` and copied from that
  descriptor into a private staging directory, which validation and the store then read.

NOTE: nothing is re-opened by path after its check, so swapping a file for a link in between
changes nothing. Other top-level names are mirrored as empty files, so the validator's checks on
names (pickle formats) see the folder's listing without their bytes being copied.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.signature import SIGNATURE_FILE
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.errors import PathOutsideStoreError, RegistryError, UnsafeImportError, quoted

# Entries (files and directories, at every depth) an imported folder may hold; a PEFT folder
# holds a handful. Bounds the walk of a hostile tree and the descriptors it keeps open.
MAX_IMPORT_ENTRIES = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# O_NONBLOCK: opening a fifo swapped in after the walk must fail the fstat check, not hang.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
_CHUNK_BYTES = 1 << 20
# A signed folder's other top-level files (README, the bundle) are copied to be verified.
MAX_SIGNED_EXTRA_BYTES = 16 << 20


@contextmanager
def staged_import(import_dir: Path, relative: str) -> Iterator[Path]:
    """A private copy of the adapter folder ``import_dir/relative``, removed after the block.

    Raises ``PathOutsideStoreError`` for a path leaving the import directory,
    ``UnsafeImportError`` for a link or non-regular file, ``RegistryError`` for a missing folder.
    """
    parts = _components(relative)
    where = "/".join(parts) or "."
    with tempfile.TemporaryDirectory(prefix="loraplex-import-") as staging:
        folder = _open_folder(import_dir, parts)
        try:
            names = _check_tree(folder, where)
            signed = SIGNATURE_FILE in names
            for name in names:
                _stage(folder, name, Path(staging) / name, f"{where}/{name}", signed)
        except FileNotFoundError as exc:
            raise RegistryError(f"path {quoted(where)} changed while it was read") from exc
        finally:
            os.close(folder)
        yield Path(staging)


def _components(relative: str) -> tuple[str, ...]:
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts:
        raise PathOutsideStoreError(
            f"path {quoted(relative)} is invalid; expected a path inside the import directory "
            "(relative, without '..')"
        )
    return path.parts


def _open_folder(import_dir: Path, parts: tuple[str, ...]) -> int:
    """The folder's descriptor, reached one no-follow component at a time."""
    try:  # the operator's root may be a link
        fd = os.open(import_dir, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError) as exc:  # checked at start; removed since
        raise RegistryError(
            f"import_dir {import_dir} is invalid; expected a directory (the server's import root)"
        ) from exc
    try:
        for index, part in enumerate(parts):
            where = "/".join(parts[: index + 1])
            parent, fd = fd, _open_dir(part, fd, where)
            os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(name: str, parent: int, where: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise
        # NOTE: Linux answers ENOTDIR, not ELOOP, for a link opened with O_DIRECTORY.
        if exc.errno != errno.ENOENT and _is_link(name, parent):
            raise _unsafe(where, "is a symbolic link") from exc
        raise RegistryError(
            f"path {quoted(where)} is invalid; expected a directory in the import directory"
        ) from exc


def _is_link(name: str, parent: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _check_tree(folder: int, where: str) -> list[str]:
    """Refuses any link or non-regular file at any depth; the folder's top-level names."""
    names = sorted(os.listdir(folder))
    _check_entries(folder, names, where, 0)
    return names


def _check_entries(fd: int, names: list[str], where: str, seen: int) -> int:
    """Checks ``names`` in directory ``fd`` and below; entries seen so far, these included."""
    for name in names:
        seen += 1
        if seen > MAX_IMPORT_ENTRIES:
            raise UnsafeImportError(
                f"path {quoted(where)} holds more than {MAX_IMPORT_ENTRIES} entries; expected "
                "an adapter folder (adapter_config.json and adapter_model.safetensors)"
            )
        path = f"{where}/{name}"
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            _check_file(info, path)
            continue
        child = _open_dir(name, fd, path)
        try:
            seen = _check_entries(child, sorted(os.listdir(child)), path, seen)
        finally:
            os.close(child)
    return seen


def _check_file(info: os.stat_result, path: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise _unsafe(path, "is a symbolic link")
    if not stat.S_ISREG(info.st_mode):
        raise _unsafe(path, "is not a regular file")
    if info.st_nlink != 1:
        raise _unsafe(path, f"has {info.st_nlink} hard links")


def _stage(folder: int, name: str, dest: Path, path: str, signed: bool) -> None:
    """Copies one of the two PEFT files from its no-follow descriptor; mirrors other names.

    In a signed folder (one holding ``model.sig``) every top-level file is copied, since the
    signature covers its bytes; each beyond the two PEFT files is bounded.
    """
    if name not in (CONFIG_FILE, WEIGHTS_FILE) and not signed:
        dest.touch(mode=0o600)
        return
    bound = None if name in (CONFIG_FILE, WEIGHTS_FILE) else MAX_SIGNED_EXTRA_BYTES
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _unsafe(path, "is a symbolic link") from exc
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode) and signed:
            dest.touch(mode=0o600)  # signed folders: top-level files only (see docs/registry.md)
            return
        _check_file(info, path)
        if bound is not None and info.st_size > bound:
            raise UnsafeImportError(
                f"path {quoted(path)} has {info.st_size} bytes; files of a signed folder beside "
                f"the adapter's own are copied to verify them, up to {bound} bytes each"
            )
        os.set_blocking(fd, True)
        _copy(fd, dest)
    finally:
        os.close(fd)


def _copy(source: int, dest: Path) -> None:
    with os.fdopen(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        while chunk := os.read(source, _CHUNK_BYTES):
            out.write(chunk)


def _unsafe(path: str, problem: str) -> UnsafeImportError:
    return UnsafeImportError(
        f"path {quoted(path)} {problem}; imported folders may hold only directories and regular "
        "files with a single link (nothing that reads outside the import directory)"
    )
