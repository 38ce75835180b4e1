"""The simulator's one frozen config: the deployment a run simulates (docs/simulator.md).

Field names follow ``loraplex serve``'s settings where one exists (``max_loras``,
``max_num_seqs``, ...), so a simulated configuration reads as the served one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loraplex.engine.tenant_shares import TenantSettings
from loraplex.residency.ledger import check_tier_share
from loraplex.residency.policy import DEFAULT_POLICY as DEFAULT_EVICTION
from loraplex.residency.policy import policy_names as eviction_names
from loraplex.residency.warm import (
    DEFAULT_AUTO_WARM_INTERVAL_S,
    check_auto_warm_settings,
    default_auto_gpu_slots,
)
from loraplex.router import DEFAULT_POLICY as DEFAULT_ROUTING
from loraplex.router import policy_names as routing_names
from loraplex.router.router import follows_dedication, router_config
from loraplex.router.topology import TopologyConfig

_AT_LEAST_ONE = (
    "replicas",
    "max_loras",
    "max_lora_rank",
    "default_rank",
    "bytes_per_rank",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "num_kv_blocks",
    "block_size",
    "max_queue_len",
    "max_concurrent_loads",
    "tenant_max_concurrent_loads",
)


@dataclass(frozen=True)
class SimConfig:
    """One simulated deployment: N identical replicas, each an engine with its adapter cache."""

    replicas: int = 1  # engine replicas; above 1 the router picks one per request
    routing_policy: str = DEFAULT_ROUTING  # a name of ``router.policy_names()``
    eviction_policy: str = DEFAULT_EVICTION  # a name of ``residency.policy.policy_names()``
    max_loras: int = 8  # GPU slots per replica
    max_lora_rank: int = 64  # a slot's rank (its bytes: max_lora_rank * bytes_per_rank)
    default_rank: int = 16  # rank of a trace adapter that names none
    bytes_per_rank: int = 65536  # an adapter's bytes per unit of rank (all layers, targets)
    cpu_adapter_bytes: int = 1 << 30  # L1 budget per replica
    disk_cache_bytes: int = 8 << 30  # L2 budget per replica
    max_num_seqs: int = 32  # sequences decoding at once
    max_num_batched_tokens: int = 512  # tokens in one step
    max_model_len: int = 512  # prompt + output tokens of one sequence (serve's default)
    num_kv_blocks: int = 1024  # KV blocks per replica (serve's default)
    block_size: int = 16  # tokens per KV block
    queue_deadline_s: float = 30.0  # longest queue residence before the request fails
    max_queue_len: int = 1024  # queued requests per replica before one is refused
    # ``loraplex serve``'s step_work_ratio (engine/sched/step_share.py); 0: off
    step_work_ratio: float = 1.0
    max_concurrent_loads: int = 4  # adapter loads in flight per replica
    tenant_max_concurrent_loads: int = 2  # ... per tenant (the cold-load quota)
    # The share of each tier's bytes (and GPU slots) a tenant without a cap of its own may hold:
    # ``loraplex serve``'s default_tenant_tier_share, 0.5 there too.
    default_tenant_tier_share: float = 0.5
    auto_warm: bool = True  # automatic warm promotion/demotion from request rates, as served
    # virtual seconds between two automatic rebalances
    auto_warm_interval_s: float = DEFAULT_AUTO_WARM_INTERVAL_S
    # GPU slots automatic promotion may pin; None: a quarter of max_loras (the server's default)
    max_auto_gpu_slots: int | None = None
    idle_wait_s: float = 0.05  # an engine with nothing runnable plans again after this
    report_interval_s: float = 0.5  # a replica's report is this old at most (fleet report_period_s)
    timeout_s: float = 60.0  # a failed request counts as this TTFT in the percentiles
    seed: int = 0  # the router's random choices
    # Per tenant: its weight (priority class), byte caps per tier, cold-load quota and seats, as
    # the registry hands them to a server's scheduler and cache; absent tenants: the defaults.
    tenants: Mapping[str, TenantSettings] = field(default_factory=dict)
    # A fleet's topology (``[fleet] topology``: ``router/topology.py``): the real
    # ``FleetTopology`` dedicates a replica to a hot revision, which it runs merged
    # (``sim/fleet.py``); None: no dedication, as a fleet without the table
    topology: TopologyConfig | None = None
    # The fleet's ``router`` table (``[fleet] router``: RouterConfig keys to override, e.g.
    # ``max_queued``), refused as the fleet refuses it (``router.router_config``); read by the
    # routed fleet only, so refused with one replica. Empty: RouterConfig's defaults
    router: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _AT_LEAST_ONE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an integer >= 1")
        for name in ("cpu_adapter_bytes", "disk_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 0")
        check_tier_share(self.default_tenant_tier_share)
        if not self.step_work_ratio >= 0:
            raise ValueError(f"step_work_ratio {self.step_work_ratio} is invalid; expected >= 0")
        auto_gpu = self.max_auto_gpu_slots
        if auto_gpu is not None and not 0 <= auto_gpu < self.max_loras:
            raise ValueError(
                f"max_auto_gpu_slots {auto_gpu} is invalid; expected 0 to max_loras - 1 "
                f"({self.max_loras - 1})"
            )
        timed = ("queue_deadline_s", "idle_wait_s", "report_interval_s", "timeout_s")
        for name in (*timed, "auto_warm_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        check_auto_warm_settings(self.auto_warm, self.auto_warm_interval_s, auto_gpu)
        if self.routing_policy not in routing_names():
            raise ValueError(
                f"routing_policy {self.routing_policy!r} is invalid; expected one of "
                f"{list(routing_names())}"
            )
        self._check_router()
        if self.eviction_policy not in eviction_names():
            raise ValueError(
                f"eviction_policy {self.eviction_policy!r} is invalid; expected one of "
                f"{list(eviction_names())}"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} is invalid; expected >= "
                f"max_num_seqs {self.max_num_seqs}"
            )
        self._check_topology()
        for tenant, settings in self.tenants.items():
            if not tenant or not isinstance(settings, TenantSettings):
                raise ValueError(
                    f"tenants[{tenant!r}] is invalid; expected a tenant name -> TenantSettings"
                )
        # ``loraplex serve``'s rule (engine/config.py): a KV space smaller than one sequence
        # would leave a long request waiting for blocks that never free, the run never ending.
        if self.num_kv_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"num_kv_blocks {self.num_kv_blocks} x block_size {self.block_size} is invalid; "
                f"expected room for one max_model_len {self.max_model_len} sequence"
            )
        if self.default_rank > self.max_lora_rank:
            raise ValueError(
                f"default_rank {self.default_rank} is invalid; expected <= max_lora_rank "
                f"{self.max_lora_rank}"
            )

    def _check_router(self) -> None:
        """The ``router`` table as the fleet checks it; with one replica nothing routes, so a
        table there would be read by nothing and is refused."""
        router_config(self.routing_policy, self.router)
        if self.router and self.replicas < 2:
            raise ValueError(
                f"router is set with replicas {self.replicas}; expected replicas >= 2 (one "
                "replica is never routed), or no router keys"
            )

    def _check_topology(self) -> None:
        """A topology that would never dedicate a replica is refused (it did nothing): too few
        replicas, or a policy that does not follow a dedication (as ``[fleet] topology``)."""
        topology = self.topology
        if topology is None:
            return
        if not isinstance(topology, TopologyConfig):
            raise ValueError(f"topology {topology!r} is invalid; expected a TopologyConfig or None")
        if self.replicas < topology.min_replicas:
            raise ValueError(
                f"topology is set with replicas {self.replicas}; expected replicas >= its "
                f"min_replicas {topology.min_replicas} (fewer dedicate none), or no topology"
            )
        if not follows_dedication(self.routing_policy):
            raise ValueError(
                f"topology is set while routing_policy is {self.routing_policy!r}, which does "
                "not send a dedicated revision's traffic to its replica; expected an affinity "
                "policy, or no topology"
            )

    @property
    def slot_bytes(self) -> int:
        return self.max_lora_rank * self.bytes_per_rank

    @property
    def auto_gpu_slots(self) -> int:
        """``max_auto_gpu_slots``, or a quarter of the slots as ``loraplex serve`` resolves it."""
        if self.max_auto_gpu_slots is None:
            return default_auto_gpu_slots(self.max_loras)
        return self.max_auto_gpu_slots


def rank_defaults(max_lora_rank: int) -> dict[str, Any]:
    """``default_rank`` (a trace adapter that names no rank) held to ``max_lora_rank`` when that
    is below the default, as every adapter of such a server is: ``sim run --max-lora-rank 8``
    read "--options: default_rank 16 is invalid" (newop4). Empty when the default fits (or the
    rank is invalid: ``SimConfig`` then names it)."""
    default = SimConfig.__dataclass_fields__["default_rank"].default
    if not isinstance(default, int) or max_lora_rank < 1 or max_lora_rank >= default:
        return {}
    return {"default_rank": max_lora_rank}
