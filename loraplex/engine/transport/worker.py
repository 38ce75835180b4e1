"""What an engine builder returns: the contract between ``EngineProcess`` (which is handed the
builder in the server process) and its child (``process_child.py``, which calls it).

Torch-free at import time, so the server process can name the contract without loading what
builds an engine: the builder imports torch when it runs, in the child.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraplex.engine.merge_holds import MergeHolds
from loraplex.engine.tenant_shares import TenantSettings

if TYPE_CHECKING:
    from loraplex.engine.core import EngineCore


@dataclass(frozen=True)
class WorkerHandles:
    """What a builder returns in the child."""

    core: EngineCore  # the engine core (driven by an EngineThread the child starts)
    idle_wait_s: float  # the engine thread's idle sleep
    max_loras: int  # GPU adapter slots
    update_tenants: Callable[[Mapping[str, TenantSettings]], None]  # live tenant settings
    close: Callable[[], None]  # after the engine thread stopped: close the cache, registry...
    # the engine's holds against merging (the admin guard's ``HoldMerges``, docs/modes.md)
    merge_holds: MergeHolds = field(default_factory=MergeHolds)
