"""``RegistryBase``, the base layer of the ``Registry`` service: what every part of it holds
(the database, the artifact store, the served base model, the wall clock, the alias rng), its
lifecycle, and the revision lookup the layers above share.

``Registry`` is one class in three layers, each file importing the one below:
``registry/registry.py`` (tenants, keys, adapters, releases, resolution, artifacts) over
``registry/trust_admin.py`` (signing: trust policies, anchors, re-verification) over this file.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.store import ArtifactStore
from loraplex.errors import quoted
from loraplex.registry import registration, releases, resolution
from loraplex.registry.models import Revision
from loraplex.registry.sql.db import Database
from loraplex.registry.trust import DEFAULT_MAX_TRUST_ANCHORS, check_max_trust_anchors


class RegistryBase:
    """The registry's state and lifecycle; see ``Registry`` for what it offers."""

    def __init__(
        self,
        db: Database,
        store: ArtifactStore,
        base: BaseModelSpec | None = None,
        *,
        max_lora_rank: int = 64,
        max_trust_anchors: int = DEFAULT_MAX_TRUST_ANCHORS,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        stage_hook: registration.StageHook | None = None,
    ) -> None:
        if max_lora_rank < 1:
            raise ValueError(f"max_lora_rank {max_lora_rank} is invalid; expected >= 1")
        check_max_trust_anchors(max_trust_anchors)
        self._db = db
        self._store = store
        self._base = base  # the served base model; required to register
        self._max_lora_rank = max_lora_rank
        self._max_trust_anchors = max_trust_anchors  # one tenant's anchors at most
        self._wall_clock = wall_clock  # created_at / audit timestamps (epoch seconds)
        self._rng = rng if rng is not None else random.Random()  # alias choice w/o request id
        self._stage_hook = stage_hook  # crash-test seam, see registration.StageHook

    @property
    def db(self) -> Database:
        return self._db

    @property
    def store(self) -> ArtifactStore:
        return self._store

    @property
    def base_digest(self) -> str | None:
        """Digest of the served base model; None when this registry was opened without one."""
        return None if self._base is None else self._base.digest

    def now(self) -> float:
        """The registry's wall clock (epoch seconds): what its records and audit rows carry."""
        return self._wall_clock()

    def close(self) -> None:
        self._db.close()

    def ping(self) -> None:
        """Readiness probe: one trivial query. Raises whatever the database raises when it
        cannot answer (closed, unreachable); cheap enough for every /ready call."""
        with self._db.transaction(write=False) as tx:
            tx.query_one("SELECT 1")

    def get_revision(self, ref: str) -> Revision:
        """``tenant/name@revision``'s record (here: both layers above read it)."""
        with self._db.transaction(write=False) as tx:
            return releases.require_revision(tx, *split_ref(ref))


def split_ref(ref: str) -> tuple[str, str, str]:
    """``tenant/name@revision`` (administrators always name the tenant)."""
    parsed = resolution.parse_model_string(ref)
    if parsed is None or parsed.owner is None or parsed.revision is None:
        raise ValueError(
            f"revision reference {quoted(ref)} is invalid; expected tenant/name@revision"
        )
    return parsed.owner, parsed.name, parsed.revision
