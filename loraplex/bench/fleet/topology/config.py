"""``bench fleet --topology``'s settings: its two sides, trace names and fixed shapes, and
``TopologyBenchConfig``.

Two sides, the same fleet otherwise (``replicas`` engine replicas, the default routing policy,
every trace adapter in the slot pools): ``unmerged`` (every replica ``mode = "unmerged"``, no
``[fleet] topology``: the always-unmerged baseline the Done-when names) and ``auto+topology``
(every replica ``mode = "auto"`` and ``[fleet] topology`` on with its defaults: one replica may
be dedicated to a revision whose share would fill one, ``router/topology.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loraplex.residency.policy import DEFAULT_POLICY as EVICTION_POLICY

UNMERGED, TOPOLOGY = "unmerged", "auto+topology"
SIDES = (UNMERGED, TOPOLOGY)  # forward run order (ABBA alternates it)
TRACE_SHARES: dict[str, float | None] = {"skewed80": 0.8, "uniform16": None}  # hot share
TENANT = "modes"  # the one tenant owning the 16 revisions
NUM_REVISIONS = 16  # bench modes' NUM_ADAPTERS
RANKS = (8, 16, 32, 64)  # bench modes' ranks, cycled from the hot revision's
HOT_RANK = 16  # bench modes' default hot rank
OUTPUT_TOKENS = (8, 24)  # generated tokens per request, inclusive (bench modes' replay)
MAX_LORA_RANK = 64
RAY_CPUS = 1  # as ``bench fleet``
PROBE_TOKENS = 8  # greedy tokens per probe
PROBE_PROMPT_TOKENS = 16
_POSITIVE_INTS = (
    "repeats",
    "replicas",
    "max_loras",
    "torch_threads",
    "trace_requests",
    "prompt_tokens",
    "capacity_requests",
    "capacity_rounds",
)


@dataclass(frozen=True)
class TopologyBenchConfig:
    """What one ``bench fleet --topology`` invocation does."""

    traces: tuple[str, ...] = tuple(TRACE_SHARES)
    repeats: int = 3  # ABBA pairs per trace (medians over them)
    replicas: int = 2  # engine replicas per fleet (the dedication needs >= 2)
    max_loras: int = NUM_REVISIONS  # GPU slots per replica: every revision fits
    torch_threads: int = 1  # torch threads per replica
    cpu_adapter_bytes: int = 64 << 20  # L1 budget per replica
    trace_requests: int = 384  # mean requests of a trace (its duration at the rate)
    warmup_requests: int = 96  # mean requests of the unmeasured warm-up (0: none)
    rate: float | None = None  # requests per second; None: load x measured capacity
    load: float = 0.9  # trace rate as a fraction of the baseline fleet's capacity
    prompt_tokens: int = 64  # prompt tokens of every request
    request_timeout_s: float = 30.0  # bound on a request; failures count at it
    capacity_requests: int = 64  # requests of one capacity burst
    capacity_rounds: int = 2  # measured capacity bursts (the median counts)
    seed: int = 0
    asset_dir: Path = Path(".loraplex-assets")  # the base model is <dir>/test-small

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an int >= 1")
        if self.replicas < 2:
            raise ValueError(
                f"replicas {self.replicas} is invalid; expected >= 2 (topology dedicates none "
                "below its min_replicas, 2)"
            )
        warmup = self.warmup_requests
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup_requests {warmup!r} is invalid; expected an int >= 0")
        for name in ("load", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate {self.rate} is invalid; expected > 0 or None (measured)")
        unknown = [t for t in self.traces if t not in TRACE_SHARES]
        if not self.traces or unknown or len(set(self.traces)) != len(self.traces):
            raise ValueError(
                f"traces {list(self.traces)} is invalid; expected distinct names from "
                f"{list(TRACE_SHARES)}"
            )

    def plain(self) -> dict[str, Any]:
        values = asdict(self)
        values["asset_dir"] = str(self.asset_dir)
        return {
            **values,
            "sides": list(SIDES),
            "eviction_policy": EVICTION_POLICY,
            "output_tokens": list(OUTPUT_TOKENS),
            "hot_rank": HOT_RANK,
            "probe_tokens": PROBE_TOKENS,
        }
