"""``ReleaseEnv``: what the release controller needs of the process serving traffic.

The controller (``controller.py``) decides; the environment acts on the engine and the adapter
cache and reports live traffic. ``serve`` implements it over the server's engine client and
cache control; tests implement it with fakes.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from loraplex.artifacts.identity import AdapterKey
from loraplex.release.model import RevisionWindow


class ReleaseEnv(Protocol):
    def prewarm(self, key: AdapterKey, *, gpu: bool) -> Future[None]:
        """Load ``key`` into CPU memory (L1), and into a GPU slot when ``gpu``, and pin it there;
        the future fails with the load's error (a bad artifact, too large, ...)."""
        ...

    def hold(self, key: AdapterKey) -> None:
        """Pin ``key`` in L1 (keeps a revision resident for instant rollback); idempotent."""
        ...

    def unhold(self, key: AdapterKey) -> None:
        """Undo ``hold`` / ``prewarm`` pins; the revision is left to normal eviction."""
        ...

    def is_merged(self, key: AdapterKey) -> bool:
        """Whether ``key`` is merged into the engine's base weights now (docs/modes.md): the
        controller releases no revision while it is."""
        ...

    def probe(self, key: AdapterKey, tenant: str, prompt: str, max_tokens: int) -> Future[str]:
        """The greedy completion of ``prompt`` by revision ``key`` (as tenant ``tenant``)."""
        ...

    def window(self, release_id: str, revision_ref: str, since: float) -> RevisionWindow:
        """Live traffic of ``revision_ref`` (``tenant/name@revision``) answered for this release
        since ``since`` (clock seconds), including client feedback."""
        ...
