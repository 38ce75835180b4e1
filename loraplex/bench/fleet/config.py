"""``loraplex bench fleet``'s settings (``FleetBenchConfig``) and the traces' rates
(``trace_rates``): what one invocation runs, checked before anything starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.fleet.report import POLICIES, TRACES
from loraplex.bench.workloads import HOT_ONE_SHARE, RequestShape
from loraplex.residency.policy import DEFAULT_POLICY as EVICTION_POLICY
from loraplex.router.router import policy_names

MAX_LORA_RANK = 64  # the S2 ranks' largest
# ``--quick``: a smoke run of two policies on one short trace at a fixed rate (no capacity
# measurement); settings given explicitly win over these.
QUICK_SETTINGS: dict[str, Any] = {
    "traces": ("zipf-longtail",),
    "policies": ("pow2", "affinity_until_saturated"),
    "repeats": 1,
    "trace_requests": 32,
    "warmup_requests": 16,
    "rate": 3.0,
}
_POSITIVE_INTS = (
    "repeats",
    "replicas",
    "max_loras",
    "torch_threads",
    "cpu_adapter_bytes",
    "num_adapters",
    "trace_requests",
    "prompt_tokens",
    "output_tokens",
    "capacity_requests",
    "capacity_rounds",
)


@dataclass(frozen=True)
class FleetBenchConfig(RequestShape):
    """What one ``bench fleet`` invocation does."""

    traces: tuple[str, ...] = TRACES  # from TRACES
    policies: tuple[str, ...] = POLICIES  # routing policies, in forward run order
    repeats: int = 3  # runs of each policy per trace, order alternating (medians over them)
    replicas: int = 3  # engine replicas per fleet
    max_loras: int = 3  # GPU slots per replica (a small pool: routing decides the hits)
    torch_threads: int = 1  # torch threads per replica
    cpu_adapter_bytes: int = 64 << 20  # L1 budget per replica
    num_adapters: int = 64  # zipf-longtail's population
    trace_requests: int = 192  # mean requests of a trace (sets its duration at the rate)
    warmup_requests: int = 192  # mean requests of the unmeasured warm-up before it (0: none)
    rate: float | None = None  # mean requests per second; None: load x measured capacity
    load: float = 0.5  # trace rate as a fraction of the measured capacity
    # hot-one: its hot revision's demand in replicas' capacity (measured capacity / replicas)
    hot_load: float = 1.5
    prompt_tokens: int = 64  # prompt length of every request
    output_tokens: int = 16  # max tokens of every request
    request_timeout_s: float = 30.0  # bound on a request; failures count at it
    capacity_requests: int = 96  # requests of one capacity burst
    capacity_rounds: int = 2  # measured capacity bursts (the median counts)
    seed: int = 0  # workload, prompt, adapter-weight and router seed
    asset_dir: Path = Path(".loraplex-assets")  # the demo base model is <dir>/test-small

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} is invalid; expected an int >= 1")
        warmup = self.warmup_requests
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup_requests {warmup!r} is invalid; expected an int >= 0")
        for name in ("load", "hot_load", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate {self.rate} is invalid; expected > 0 or None (measured)")
        _check_names("traces", self.traces, TRACES)
        _check_names("policies", self.policies, policy_names())

    def plain(self) -> dict[str, Any]:
        """The settings as JSON values."""
        values = asdict(self)
        values["asset_dir"] = str(self.asset_dir)
        return {**values, "eviction_policy": EVICTION_POLICY, "max_lora_rank": MAX_LORA_RANK}


def _check_names(field_name: str, names: tuple[str, ...], known: tuple[str, ...]) -> None:
    unknown = [n for n in names if n not in known]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(
            f"{field_name} {list(names)} is invalid; expected distinct names from {list(known)}"
        )


def trace_rates(config: FleetBenchConfig, capacity_rps: float | None) -> dict[str, float]:
    """Each trace's mean requests per second (its length is ``trace_requests`` at that rate).

    ``rate`` when given, for every trace. Otherwise ``load`` x the measured capacity, except
    hot-one: its hot revision (``HOT_ONE_SHARE`` of the requests) must ask ``hot_load`` times
    what one replica serves, taken as the fleet's measured capacity / ``replicas``, so its
    total rate is ``hot_load`` x capacity / replicas / ``HOT_ONE_SHARE`` (defaults: 1.5 x
    capacity / 3 / 0.6 = 0.83 x capacity)."""
    if config.rate is not None:
        return dict.fromkeys(config.traces, config.rate)
    capacity = capacity_rps or 0.0
    if not capacity > 0:
        raise RuntimeError(f"measured capacity {capacity_rps} req/s leaves no trace rate")
    hot_one = config.hot_load * capacity / config.replicas / HOT_ONE_SHARE
    return {
        name: hot_one if name == "hot-one" else config.load * capacity for name in config.traces
    }
