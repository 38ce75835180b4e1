"""What one ``loraplex bench sim`` invocation runs (``bench.py``): the traces, the targets, the
real deployment's settings, the cost model's source and the scale run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loraplex.bench.sim.fleet_lone import check_cold_requests
from loraplex.bench.sim.trace_fields import GeneratedTraces
from loraplex.bench.sim.validate import RealSettings

TRACES = ("zipf-longtail", "hot-burst", "cold-storm")
TARGETS = ("single", "fleet")
SCALE = (1_000_000, 10_000, 64)  # requests, adapters, replicas (issue 30)
# fleet simulations with drawn replica ids, per trace and pricing: none, since the fleet places
# by rank (docs/simulator.md, "simrank"); for comparing runs of a fleet that placed by Ray's ids
DEFAULT_FLEET_ID_DRAWS = 0
MAX_FLEET_ID_DRAWS = 256


@dataclass(frozen=True)
class SimBenchConfig(GeneratedTraces):
    """What one ``bench sim`` invocation runs."""

    traces: tuple[str, ...] = TRACES  # validated traces
    targets: tuple[str, ...] = TARGETS  # single server, fleet
    trace_requests: int = 96  # mean requests per trace
    repeats: int = 1  # real runs of each (target, trace); compared by their median
    rate: float = 2.0  # mean requests per second
    num_adapters: int = 32  # zipf-longtail's population, cold-storm's storm pool
    prompt_tokens: int = 16  # per request
    output_tokens: int = 8  # per request
    settings: RealSettings = field(default_factory=RealSettings)  # both sides' deployment
    cost_model: Path | None = None  # None: calibrate a fresh demo server first
    scale: tuple[int, int, int] | None = SCALE  # (requests, adapters, replicas); None: skip
    seed: int = 0  # workloads, prompts, router
    asset_dir: Path = Path(".loraplex-assets")  # the demo base model is <dir>/test-small
    # where each real single-server run keeps its server's request log and the client's
    # records, and each real fleet run the client's records (``validate.RunLogs``); None: kept
    # nowhere
    logs_dir: Path | None = None
    # K > 0: the in-run calibration as short passes of 1/K of its samples, one before each real
    # run and one after the last (``interleaved.py``); 0: one calibration before the runs. With
    # cost_model (both targets needed) the passes run around the single runs only and price the
    # single target; the fleet keeps the file's pricing
    calibrate_interleaved: int = 0
    # K > 0: with cost_model, the fleet's lone terms measured as passes of 1/K of calibrate-fleet's
    # lone requests, one before each fleet run and one after the last (``fleet_interleaved.py``)
    calibrate_fleet_interleaved: int = 0
    # with calibrate_fleet_interleaved: each fleet pass's lone cold requests (fleet_load_scale;
    # 0: none, the file's own value prices the loads); None: ``PASS_COLD_REQUESTS`` (4)
    calibrate_fleet_cold_requests: int | None = None
    # K > 0: the fleet's simulated hit ratios are the mean of K simulations whose replicas carry
    # Ray-like random ids (``simulated.id_drawn_hit_ratios``); 0: one, the simulator's own names
    fleet_id_draws: int = DEFAULT_FLEET_ID_DRAWS

    def __post_init__(self) -> None:
        unknown = [t for t in self.traces if t not in TRACES]
        if not self.traces or unknown:
            raise ValueError(f"traces {list(self.traces)} is invalid; expected from {TRACES}")
        wrong = [t for t in self.targets if t not in TARGETS]
        if not self.targets or wrong:
            raise ValueError(f"targets {list(self.targets)} is invalid; expected from {TARGETS}")
        self.params()  # raises ValueError naming a bad field
        if self.repeats < 1:
            raise ValueError(f"repeats {self.repeats} is invalid; expected >= 1")
        if self.scale is not None and min(self.scale) < 1:
            raise ValueError(f"scale {self.scale} is invalid; expected three counts >= 1")
        if self.calibrate_interleaved < 0:
            raise ValueError(
                f"calibrate_interleaved {self.calibrate_interleaved} is invalid; expected >= 0"
            )
        both = {"single", "fleet"} <= set(self.targets)
        if self.calibrate_interleaved and self.cost_model is not None and not both:
            raise ValueError(
                f"calibrate_interleaved {self.calibrate_interleaved} is invalid with cost_model "
                f"{self.cost_model} and targets {list(self.targets)}: with a file the passes "
                "price the single target and the file the fleet, so both targets are needed "
                "(single alone: leave out cost_model; fleet alone: the passes would price nothing)"
            )
        fleet_k = self.calibrate_fleet_interleaved
        if fleet_k < 0:
            raise ValueError(f"calibrate_fleet_interleaved {fleet_k} is invalid; expected >= 0")
        if fleet_k and (self.cost_model is None or "fleet" not in self.targets):
            raise ValueError(
                f"calibrate_fleet_interleaved {fleet_k} is invalid with cost_model "
                f"{self.cost_model} and targets {list(self.targets)}: it measures the fleet's "
                "lone terms over a cost-model file's (a `sim calibrate-fleet` one) for the fleet"
            )
        colds = self.calibrate_fleet_cold_requests
        if colds is not None and not fleet_k:
            raise ValueError(
                f"calibrate_fleet_cold_requests {colds} is invalid with "
                f"calibrate_fleet_interleaved {fleet_k}: expected with the fleet passes (K >= 1)"
            )
        if colds is not None:
            check_cold_requests(colds, "calibrate_fleet_cold_requests")
        draws = self.fleet_id_draws
        if (
            isinstance(draws, bool)
            or not isinstance(draws, int)
            or not 0 <= draws <= MAX_FLEET_ID_DRAWS
        ):
            raise ValueError(
                f"fleet_id_draws {draws!r} is invalid; expected an integer 0 to "
                f"{MAX_FLEET_ID_DRAWS}"
            )
