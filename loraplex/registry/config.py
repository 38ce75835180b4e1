"""Where the registry keeps its state, and opening it.

Defaults, all under one data directory:

- data directory: ``$LORAPLEX_DATA_DIR``, else ``$XDG_DATA_HOME/loraplex``, else
  ``~/.local/share/loraplex`` (the CLI resolves the environment and passes the result);
- database: ``sqlite:///<data-dir>/registry.sqlite3`` (``postgresql://...`` for several machines);
- artifact store: ``<data-dir>/artifacts`` (or ``s3://bucket/prefix`` with an endpoint).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.store import ArtifactStore, LocalArtifactStore
from loraplex.registry.registration import StageHook
from loraplex.registry.registry import Registry
from loraplex.registry.sql.connect import POSTGRES_SCHEMES, open_database
from loraplex.registry.sql.migrations import migrate
from loraplex.registry.sql.timeouts import (
    DatabaseTimeouts,
    database_pool_size,
    database_timeouts,
)
from loraplex.registry.trust import (
    DEFAULT_MAX_TRUST_ANCHORS,
    check_max_trust_anchors,
    fill_key_ids,
)
from loraplex.urls import http_url

DATABASE_FILE = "registry.sqlite3"
ARTIFACTS_DIR = "artifacts"


def default_data_dir(env: Mapping[str, str], home: Path) -> Path:
    """The documented default data directory, given the environment and the home directory."""
    if env.get("LORAPLEX_DATA_DIR"):
        return Path(env["LORAPLEX_DATA_DIR"])
    if env.get("XDG_DATA_HOME"):
        return Path(env["XDG_DATA_HOME"]) / "loraplex"
    return home / ".local" / "share" / "loraplex"


@dataclass(frozen=True)
class RegistryConfig:
    """How to reach the registry database and the artifact store."""

    data_dir: Path  # holds the SQLite file and the local store unless overridden
    database_url: str | None = None  # None: SQLite in data_dir
    store: str | None = None  # local directory or s3://bucket/prefix; None: data_dir/artifacts
    s3_endpoint: str | None = None  # S3-compatible endpoint URL (None: AWS default)
    max_lora_rank: int = 64  # registrations above this rank are refused
    # PostgreSQL only (registry/sql/timeouts.py); None: the default
    database_connect_timeout_s: float | None = None  # a new connection, login included
    database_statement_timeout_s: float | None = None  # one statement, lock waits included
    database_lock_timeout_s: float | None = None  # one wait for a lock
    database_pool_size: int | None = None  # connections of one process at most
    max_trust_anchors: int = DEFAULT_MAX_TRUST_ANCHORS  # one tenant's trust anchors at most

    def __post_init__(self) -> None:
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank {self.max_lora_rank} is invalid; expected >= 1")
        check_max_trust_anchors(self.max_trust_anchors)
        if self.s3_endpoint is not None and not self.store_url.startswith("s3://"):
            raise ValueError(
                f"s3_endpoint {self.s3_endpoint!r} is invalid with store {self.store_url!r}; "
                "expected an s3:// store"
            )
        if self.s3_endpoint is not None:
            check_s3_endpoint(self.s3_endpoint)
        self._check_timeouts()

    def _check_timeouts(self) -> None:
        """ValueError naming a timeout or pool key that is invalid, or set for a SQLite
        database (which would ignore it: no server to wait on, one connection)."""
        given = {
            name: getattr(self, name)
            for name in (
                "database_connect_timeout_s",
                "database_statement_timeout_s",
                "database_lock_timeout_s",
                "database_pool_size",
            )
            if getattr(self, name) is not None
        }
        if not given:
            return
        self.timeouts()
        database_pool_size(self.database_pool_size)
        if not self.database.startswith(POSTGRES_SCHEMES):
            name, value = next(iter(given.items()))
            raise ValueError(
                f"{name} {value} is invalid with a SQLite registry; expected a postgresql:// "
                "database_url (the timeouts bound waits on a PostgreSQL server, and the pool "
                "its connections)"
            )

    def timeouts(self) -> DatabaseTimeouts | None:
        """The PostgreSQL limits (unset keys at their defaults); None for a SQLite database."""
        if not self.database.startswith(POSTGRES_SCHEMES):
            return None
        return database_timeouts(
            self.database_connect_timeout_s,
            self.database_statement_timeout_s,
            self.database_lock_timeout_s,
        )

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / DATABASE_FILE}"

    @property
    def store_url(self) -> str:
        return self.store or str(self.data_dir / ARTIFACTS_DIR)


def check_s3_endpoint(endpoint: str) -> None:
    """ValueError naming ``s3_endpoint`` unless it is ``http(s)://HOST[:PORT]...`` without
    credentials (the client's come from its environment, and a URL is shown in logs). NOTE:
    any string was passed on to boto3, which refused a bad scheme only at the first request of
    the store (a server's start or a registration, not its configuration)."""
    if http_url(endpoint, credentials=False):
        return
    shown = "with credentials" if "@" in endpoint else repr(endpoint[:200])
    raise ValueError(
        f"s3_endpoint {shown} is invalid; expected http://HOST[:PORT] or https://HOST[:PORT] "
        "without credentials (the S3 client reads them from its environment)"
    )


def open_store(config: RegistryConfig) -> ArtifactStore:
    url = config.store_url
    if url.startswith("s3://"):
        from loraplex.registry.s3 import S3ArtifactStore

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return S3ArtifactStore(bucket, prefix, endpoint_url=config.s3_endpoint)
    return LocalArtifactStore(Path(url.removeprefix("file://")))


def open_registry(
    config: RegistryConfig,
    base: BaseModelSpec | None = None,
    wall_clock: Callable[[], float] = time.time,
    rng: random.Random | None = None,
    stage_hook: StageHook | None = None,
) -> Registry:
    """Open (and migrate) the database, open the store, and return the service.

    A data directory created here is 0700: it holds the registry, adapters and secrets.
    """
    if config.database_url is None or config.store is None:
        config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = open_database(config.database, config.timeouts(), config.database_pool_size)
    try:
        migrate(db, wall_clock())
        fill_key_ids(db)  # anchors added before schema version 7
    except BaseException:
        db.close()
        raise
    store = open_store(config)
    return Registry(
        db,
        store,
        base,
        max_lora_rank=config.max_lora_rank,
        max_trust_anchors=config.max_trust_anchors,
        wall_clock=wall_clock,
        rng=rng,
        stage_hook=stage_hook,
    )
