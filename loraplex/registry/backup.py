"""A consistent copy of a data directory while its server runs (``loraplex backup``).

Copying ``registry.sqlite3`` with ``cp`` while a server writes is not a backup: in WAL mode the
newest commits live in ``registry.sqlite3-wal`` until a checkpoint, and a copy of the two files
taken at different moments can be torn. So the database is copied with SQLite's online backup
API (one read transaction: one committed snapshot; the server's writes go on meanwhile), and the
store's objects are copied after it. Objects are immutable, named by their digest and written
before the rows that name them, and never deleted, so every object the snapshot names is in the
store by then; the copy checks that anyway. The copy is a data directory: ``loraplex serve
--data-dir DEST`` serves it (the adapter cache is rebuilt from the store; it is not copied).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from loraplex.errors import RegistryError
from loraplex.registry.config import ARTIFACTS_DIR, DATABASE_FILE, RegistryConfig

SQLITE_PREFIX = "sqlite:///"
SECRET_FILES = ("admin-key", "trace-secret")  # serve's admin key, the tracing HMAC key
DEMO_DIR = "demo-assets"  # the demo model a demo-mode server serves (minutes to regenerate)
DIR_MODE = 0o700
FILE_MODE = 0o600
# the revisions' columns naming store objects (base_digest names the base model, not an object)
_OBJECT_COLUMNS = ("adapter_digest", "config_digest", "signature_digest")


@dataclass(frozen=True)
class BackupResult:
    """What ``backup_data_dir`` copied."""

    database: Path  # the copied registry database
    schema_version: int  # the copy's registry schema version
    objects: int  # store objects copied (0 with a remote store)
    object_bytes: int  # their bytes
    remote_store: str | None  # an s3:// store, not copied; None for a local store
    files: tuple[str, ...]  # secrets and the demo assets copied, by name in the data dir


def backup_data_dir(config: RegistryConfig, dest: Path) -> BackupResult:
    """Copy the registry, the local store, the secrets and the demo assets into ``dest`` (which
    must not exist, or be empty). ``ValueError`` names what cannot be backed up this way."""
    database = config.database
    if not database.startswith(SQLITE_PREFIX) or database.endswith(":memory:"):
        raise ValueError(
            "database_url: loraplex backup copies a SQLite registry only; back up a PostgreSQL "
            "registry with its own tools (pg_dump)"
        )
    source = Path(database.removeprefix(SQLITE_PREFIX))
    if not source.is_file():
        raise ValueError(f"data_dir: no registry at {source}; nothing to back up")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} is not empty; back up into a new directory")
    dest.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    copied_db = dest / DATABASE_FILE
    store = config.store_url
    remote = store if store.startswith("s3://") else None
    try:
        version = _copy_database(source, copied_db)
        objects, size = (
            (0, 0) if remote else _copy_objects(Path(store.removeprefix("file://")), dest)
        )
        if remote is None:
            _check_objects(copied_db, dest / ARTIFACTS_DIR)
    except sqlite3.Error as exc:  # not a database, or an unreadable one
        raise RegistryError(f"{source}: {exc}; the backup in {dest} is incomplete") from exc
    return BackupResult(copied_db, version, objects, size, remote, _copy_files(config, dest))


def _copy_database(source: Path, target: Path) -> int:
    reader = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.close(fd)
        copy = sqlite3.connect(target)
        try:
            reader.backup(copy)  # every page in one step: one snapshot
            # one self-contained file (no -wal beside it); serve puts it back in WAL mode
            copy.execute("PRAGMA journal_mode = DELETE")
            (version,) = copy.execute("SELECT max(version) FROM schema_migrations").fetchone()
        finally:
            copy.close()
    finally:
        reader.close()
    return int(version)


def _copy_objects(root: Path, dest: Path) -> tuple[int, int]:
    count = size = 0
    (dest / ARTIFACTS_DIR).mkdir(mode=DIR_MODE)
    for path in sorted((root / "sha256").glob("*/*")):
        if not path.is_file():
            continue
        target = dest / ARTIFACTS_DIR / path.relative_to(root)
        target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        target.chmod(FILE_MODE)
        count += 1
        size += target.stat().st_size
    return count, size


def _check_objects(database: Path, store: Path) -> None:
    conn = sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)
    try:
        # an older schema (a backup before an upgrade) lacks the later columns
        present = {row[1] for row in conn.execute("PRAGMA table_info(revisions)")}
        named = {
            digest
            for column in _OBJECT_COLUMNS
            if column in present
            for (digest,) in conn.execute(f"SELECT DISTINCT {column} FROM revisions")
            if digest is not None
        }
    finally:
        conn.close()
    missing = sorted(d for d in named if not (store / "sha256" / d[:2] / d).is_file())
    if missing:
        raise ValueError(
            f"store: {len(missing)} objects the registry names are not in the store "
            f"(first {missing[0]}); the backup in {store.parent} is incomplete"
        )


def _copy_files(config: RegistryConfig, dest: Path) -> tuple[str, ...]:
    copied = []
    for name in SECRET_FILES:
        path = config.data_dir / name
        if path.is_file():
            fd = os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "wb") as out:
                out.write(path.read_bytes())
            copied.append(name)
    demo = config.data_dir / DEMO_DIR
    if demo.is_dir():
        shutil.copytree(demo, dest / DEMO_DIR)
        copied.append(DEMO_DIR)
    return tuple(copied)
