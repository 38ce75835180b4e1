"""What one ``loraplex bench serve`` invocation does (``ServeBenchConfig``): its traces' shape
and the scenarios, policies and settings it compares, each checked when the config is made;
``bench.run_serve_bench`` runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loraplex.bench.serve.adversarial import ADVERSARIAL, AdversarialConfig
from loraplex.bench.serve.share_arms import check_share_setting
from loraplex.bench.serve.summary import HOT_BURST_BASELINES, HOT_BURST_CANDIDATES
from loraplex.bench.workloads import RequestShape
from loraplex.residency.ledger import check_tier_share
from loraplex.residency.policy import policy_names

SCENARIOS = ("hot-burst", "zipf-longtail", "cold-storm")  # the default
KNOWN_SCENARIOS = (*SCENARIOS, ADVERSARIAL)  # adversarial is opt-in: it attacks the server


@dataclass(frozen=True)
class ServeBenchConfig(RequestShape):
    """What one benchmark invocation does."""

    duration_s: float | None = None  # wall seconds of each trace; None: trace_requests / rate
    rate: float | None = None  # mean requests per second of each trace; None: load x capacity
    load: float = 0.6  # trace rate as a fraction of the measured capacity (when rate is None)
    trace_requests: int = 720  # mean requests of a trace (when duration_s is None)
    prompt_tokens: int = 64  # prompt length of every request
    output_tokens: int = 16  # max tokens of every request
    num_adapters: int = 64  # zipf-longtail population and cold-storm's storm pool
    max_loras: int = 16  # GPU slots (zipf-longtail, cold-storm, throughput)
    # hot-burst's slot counts (the 8 hot adapters + 1, + 4, x 2); the first is the headline's
    hot_burst_slots: tuple[int, ...] = (9, 12, 16)
    # hot-burst: the policies measured against lru and lru_priority at every slot count
    hot_burst_candidates: tuple[str, ...] = HOT_BURST_CANDIDATES
    trace_repeats: int = 2  # runs of each trace comparison, order alternating (ABBA)
    cpu_adapter_bytes: int = 128 << 20  # L1 budget
    max_lora_rank: int = 64  # ranks above (WIDE's 128) are capped
    throughput_requests: int = 256  # requests per throughput round
    throughput_rounds: int = 4  # alternating rounds per side
    capacity_requests: int = 128  # requests per capacity round (HTTP, all at once)
    request_timeout_s: float = 60.0  # bound on every request
    seed: int = 0  # workload and weight seed
    asset_dir: Path = Path(".loraplex-assets")  # where the demo base model is generated / reused
    scenarios: tuple[str, ...] = field(default=SCENARIOS)  # subset of KNOWN_SCENARIOS
    adversarial: AdversarialConfig = field(default_factory=AdversarialConfig)  # its attacker
    # where each trace run keeps its server's request log and the client's records
    # (``runs.run_logs``); None: kept nowhere
    logs_dir: Path | None = None
    # the trace runs' ``default_tenant_tier_share``; None: the server's default (0.5)
    tenant_tier_share: float | None = None
    # the trace runs' ``tier_share_by_priority``: "off", "on", or "both" (each hot-burst run
    # with the rule off and on, ABBA: ``share_arms``)
    tier_share_by_priority: str = "off"
    # hot-burst: the baselines every candidate is measured against (lru and / or lru_priority)
    hot_burst_baselines: tuple[str, ...] = HOT_BURST_BASELINES

    def __post_init__(self) -> None:
        for name in (
            "load",
            "trace_requests",
            "prompt_tokens",
            "output_tokens",
            "num_adapters",
            "max_loras",
            "trace_repeats",
            "cpu_adapter_bytes",
            "max_lora_rank",
            "throughput_requests",
            "throughput_rounds",
            "capacity_requests",
            "request_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        for name in ("duration_s", "rate"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} {value} is invalid; expected > 0 or None (derived)")
        if not self.hot_burst_slots or min(self.hot_burst_slots) < 1:
            raise ValueError(
                f"hot_burst_slots {self.hot_burst_slots} is invalid; expected slot counts >= 1"
            )
        known = set(policy_names()) - set(HOT_BURST_BASELINES)
        candidates = self.hot_burst_candidates
        if not candidates or len(set(candidates)) != len(candidates) or set(candidates) - known:
            raise ValueError(
                f"hot_burst_candidates {list(candidates)} is invalid; expected distinct names "
                f"from {sorted(known)} (lru and lru_priority always run as the baselines)"
            )
        unknown = set(self.scenarios) - set(KNOWN_SCENARIOS)
        if unknown:
            raise ValueError(
                f"scenarios {sorted(unknown)} is invalid; expected from {KNOWN_SCENARIOS}"
            )
        if self.tenant_tier_share is not None:
            check_tier_share(self.tenant_tier_share, "tenant_tier_share")
        self._check_share_arms()
        if self.logs_dir is not None and not set(self.scenarios) & set(SCENARIOS):
            raise ValueError(
                f"logs_dir {self.logs_dir} is invalid; only the trace runs ({SCENARIOS}) keep "
                f"logs, and scenarios {list(self.scenarios)} has none"
            )

    def _check_share_arms(self) -> None:
        baselines = self.hot_burst_baselines
        if not baselines or len(set(baselines)) != len(baselines):
            raise ValueError(
                f"hot_burst_baselines {list(baselines)} is invalid; expected distinct names "
                f"from {list(HOT_BURST_BASELINES)} (other policies are candidates)"
            )
        if set(baselines) - set(HOT_BURST_BASELINES):
            raise ValueError(
                f"hot_burst_baselines {list(baselines)} is invalid; expected names from "
                f"{list(HOT_BURST_BASELINES)} (other policies are candidates)"
            )
        check_share_setting(self.tier_share_by_priority, self.scenarios, SCENARIOS)

    def trace_shape(self, capacity_rps: float | None) -> tuple[float, float]:
        """(rate, duration_s) of the traces, given the measured capacity (None: unmeasured)."""
        rate = self.rate if self.rate is not None else self.load * (capacity_rps or 0.0)
        if not rate > 0:
            raise RuntimeError(f"measured capacity {capacity_rps} req/s leaves no trace rate")
        duration = self.duration_s if self.duration_s is not None else self.trace_requests / rate
        return rate, duration
