"""``bench sim --calibrate-interleaved K``: the in-run calibration as short passes spread over
the invocation, one before each real run and one after the last (docs/simulator.md, "SIMCAL").

A lone calibration of a few minutes priced the decode token at 112 / 588 / 751 us in three
holds an hour apart on the shared machine (SIMFLEET3), and the real runs it was compared with
ran minutes later at another speed. Each pass here is a fresh ``sim calibrate --self`` server
measuring 1/K of the single calibration's decode-mix repeats and lone requests (its own
controlled requests only: never the traces validated), so the passes sample the host's speed
across the runs. A trace is then priced from the merged samples of the passes adjacent to its
runs (``adjacent_passes``) or of all passes (``merged``); both are reported.

A pass whose own fit does not hold together is left out of every model (``disturbed_passes``;
docs/simulator.md, "SIMBOTH"): its prefill-token price fitted to 0, or its decode or prefill
token price more than ``MAX_PRICE_RATIO`` times the passes' median. Pooling samples lets one
disturbed pass pull every model that includes it (SIMCAL's hold 3: a pass at 634 us a decode
token and prefill 0 beside three at 141-201 us); which passes were left out, and why, is in
the report.
"""

from __future__ import annotations

import datetime
import json
import math
import shutil
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loraplex.bench.sim.calibrate_cold import lease_handoffs
from loraplex.bench.sim.calibrate_run import CalibrateConfig, slots_for_mixes
from loraplex.bench.sim.calibrate_target import Target
from loraplex.sim.calibrate import fit_step
from loraplex.sim.cost_model import CostModel, StepCost
from loraplex.sim.host_speed import HostProbe

Pricing = Callable[[str, str], CostModel]  # (target, trace) -> the cost model simulating it

# measured lists a merge concatenates (``calibration.measure``'s keys); ``timings`` and
# ``timed`` stay paired index by index, as each pass's are
LISTS = (
    "loads",
    "steps",
    "decode_mixes",
    "ttft_prefills",
    "timings",
    "timed",
    "cold",
    "busy",
    "residuals",
    "lone",
)
MIN_LONE_REQUESTS = 2  # per prefill sample and pass: one gives no spread (hop_jitter_s)
MAX_PRICE_RATIO = 2.0  # a pass's token price over the passes' median beyond which it is left out
CHECKED_PRICES = ("per_token_s", "per_prefill_token_s")  # the step's token prices checked


def pass_config(fraction: int, base: CalibrateConfig | None = None) -> CalibrateConfig:
    """One pass's share of ``base``: 1/``fraction`` of its decode-mix repeats (at least 1) and
    of its lone requests per prefill sample (at least ``MIN_LONE_REQUESTS``)."""
    if fraction < 1:
        raise ValueError(f"calibrate_interleaved {fraction} is invalid; expected >= 1")
    base = CalibrateConfig() if base is None else base
    return replace(
        base,
        repeats=max(1, math.ceil(base.repeats / fraction)),
        overhead_requests=max(MIN_LONE_REQUESTS, math.ceil(base.overhead_requests / fraction)),
    )


def merged(measures: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several passes' ``calibration.measure`` results as one: their samples together, the step
    refitted on them all, ``front_s`` the median of the passes' (each a median itself), the
    lease hand-offs redone over all their servers' request logs."""
    if not measures:
        raise ValueError("measures is empty; expected at least one pass")
    out: dict[str, Any] = {key: [x for m in measures for x in m[key]] for key in LISTS}
    out["log_lines"] = [line for m in measures for line in m.get("log_lines", [])]
    out["hop_busy"] = [x for m in measures for x in m.get("hop_busy", [])]  # per server
    # each pass's fresh server's first request (calibration.measure): one fit per pass
    out["first"] = [fit for m in measures for fit in m.get("first", [])]
    out["sizes"] = {ref: n for m in measures for ref, n in m.get("sizes", {}).items()}
    out["step_fit"] = fit_step(out["steps"])
    out["front_s"] = statistics.median(m["front_s"] for m in measures)
    out["handoffs"] = lease_handoffs(out["log_lines"]) if out["log_lines"] else None
    return out


def adjacent_passes(run_indices: Iterable[int], num_passes: int) -> list[int]:
    """The passes around the given runs: pass i runs right before run i, and the last pass
    after the last run, so run i lies between passes i and i + 1."""
    chosen: set[int] = set()
    for i in run_indices:
        if not 0 <= i < num_passes - 1:
            raise ValueError(f"run {i} is invalid; expected 0 <= run < {num_passes - 1}")
        chosen.update((i, i + 1))
    return sorted(chosen)


def disturbed_passes(fits: Sequence[StepCost]) -> dict[int, str]:
    """Pass index -> why it is left out, for each pass whose own step fit does not hold
    together: its ``per_prefill_token_s`` fitted to 0 (non-negative least squares put the
    prompt tokens' cost elsewhere), or a token price (``CHECKED_PRICES``) more than
    ``MAX_PRICE_RATIO`` times the median of every pass's. With two passes the median is their
    mean, which neither exceeds twice: only the first rule can leave one out."""
    out: dict[int, str] = {}
    for i, fit in enumerate(fits):
        if fit.per_prefill_token_s is not None and fit.per_prefill_token_s <= 0:
            out[i] = "per_prefill_token_s fitted to 0"
    for name in CHECKED_PRICES:
        prices = [getattr(fit, name) for fit in fits]
        known = [p for p in prices if p is not None]
        if not known:
            continue
        median = statistics.median(known)
        for i, price in enumerate(prices):
            if i not in out and price is not None and price > MAX_PRICE_RATIO * median:
                out[i] = (
                    f"{name} {price * 1e6:.1f} us is more than {MAX_PRICE_RATIO:g}x the passes' "
                    f"median {median * 1e6:.1f} us"
                )
    return out


def pass_figures(model: CostModel) -> dict[str, float | None]:
    """The figures whose drift separated holds: the decode token's price, the step's fixed
    price and the hop."""
    return {
        "per_token_s": model.step.per_token_s,
        "step_fixed_s": model.step.step_fixed_s,
        "per_prefill_token_s": model.step.per_prefill_token_s,
        "ipc_s": model.ipc_s,
        "front_s": model.front_s,
    }


@dataclass(frozen=True)
class CalibrationPass:
    """One short pass: what it measured, on which server, and the host probes around it."""

    target: Target  # the pass's server (stopped since; its shapes and settings are kept)
    measured: dict[str, Any]  # ``calibration.measure``'s result
    probes: tuple[HostProbe, HostProbe]  # before and after the measurements
    started: str  # UTC, ISO seconds


@dataclass
class InterleavedCalibration:
    """Runs the passes (``run_pass``, called by ``bench.real`` before each real run and once
    after the last) and fits cost models from any set of them (``model_of``)."""

    asset_dir: Path  # the demo assets
    max_loras: int  # the real runs' slots (the pass server takes at least the mixes' need)
    hardware: str  # the cost models' hardware name
    fraction: int  # K: each pass measures 1/K of the single calibration's samples
    logs_dir: Path | None = None  # keeps each pass's report and request log
    passes: list[CalibrationPass] = field(default_factory=list)  # in the order run
    config: CalibrateConfig = field(init=False)  # one pass's (``pass_config``)

    def __post_init__(self) -> None:
        self.config = pass_config(self.fraction)

    def run_pass(self) -> None:
        from loraplex.bench.sim.calibrate_target import self_target
        from loraplex.bench.sim.calibration import measure
        from loraplex.bench.sim.host_probe import host_probe

        slots = max(self.max_loras, slots_for_mixes(self.config))
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        sets = ("attn", "all")  # both target sets: the weight terms are fitted
        with self_target(self.asset_dir, (8, 16, 32, 64), 2, slots, 0, target_sets=sets) as target:
            before = host_probe()
            measured = measure(target, self.config)
            after = host_probe()
            if self.logs_dir is not None and target.request_log is not None:
                where = self.logs_dir / f"calibration-p{len(self.passes)}.requests.jsonl"
                shutil.copyfile(target.request_log, where)
        self.passes.append(CalibrationPass(target, measured, (before, after), started))

    def model_of(self, indices: Sequence[int]) -> tuple[CostModel, dict[str, Any]]:
        """The cost model and report fitted on the merged samples of passes ``indices``."""
        from loraplex.bench.sim.calibrate_fit import cost_model_from

        chosen = [self.passes[i] for i in indices]
        measured = merged([p.measured for p in chosen])
        probes = [probe for p in chosen for probe in p.probes]
        command = (
            f"loraplex bench sim --calibrate-interleaved {self.fraction} "
            f"(calibrate --self, passes {list(indices)} of {len(self.passes)})"
        )
        return cost_model_from(
            chosen[-1].target,
            self.config,
            measured,
            probes=probes,
            hardware=self.hardware,
            command=command,
        )

    def disturbed(self) -> dict[int, str]:
        """The passes whose own fit does not hold together, and why (``disturbed_passes``)."""
        return disturbed_passes([p.measured["step_fit"].step for p in self.passes])

    def kept(self) -> list[int]:
        """The passes every model is fitted from: all but the ``disturbed`` ones; all of them
        when every pass is (no model can be fitted from no samples)."""
        out = self.disturbed()
        return [i for i in range(len(self.passes)) if i not in out] or list(range(len(self.passes)))

    def pass_report(self) -> list[dict[str, Any]]:
        """Each pass alone: its start, its figures (``pass_figures``), its host probes. With
        ``logs_dir``, each pass's report is kept there too."""
        out = []
        for i, one in enumerate(self.passes):
            model, report = self.model_of([i])
            if self.logs_dir is not None:
                text = json.dumps(report, sort_keys=True) + "\n"
                where = self.logs_dir / f"calibration-p{i}.samples.json"
                where.write_text(text, encoding="utf-8")
            total = [p.total_s for p in one.probes]
            out.append({"started": one.started, **pass_figures(model), "probe_total_s": total})
        return out


def interleaved_pricing(
    calibration: InterleavedCalibration, order: list[tuple[str, str]]
) -> tuple[CostModel, Pricing, dict[str, Any]]:
    """From the passes run between ``order``'s real runs: the model of all kept passes' merged
    samples (``InterleavedCalibration.kept``), each (target, trace) priced by its kept adjacent
    passes' (``adjacent_passes``; all kept passes where both of a run's were left out), and the
    report: the per-pass figures, the passes left out and why, and which passes priced each
    trace."""
    num = len(calibration.passes)
    if num != len(order) + 1:
        raise ValueError(
            f"{num} passes for {len(order)} runs; expected one before each run and one after "
            "the last"
        )
    kept = calibration.kept()
    whole, _ = calibration.model_of(kept)
    chosen: dict[tuple[str, str], list[int]] = {}
    widened: list[list[str]] = []
    for pair in dict.fromkeys(order):
        around = adjacent_passes([i for i, run in enumerate(order) if run == pair], num)
        chosen[pair] = [i for i in around if i in kept] or kept
        if not set(around) & set(kept):
            widened.append(list(pair))
    models = {pair: calibration.model_of(passes)[0] for pair, passes in chosen.items()}
    report = {
        "fraction": calibration.fraction,
        "passes": calibration.pass_report(),
        # every pass the rule finds disturbed: left out unless every pass is (then all kept)
        "disturbed": [{"pass": i, "why": w} for i, w in sorted(calibration.disturbed().items())],
        "kept": kept,
        "adjacent": {t: {n: p for (t2, n), p in chosen.items() if t2 == t} for t, _ in chosen},
        "all_kept_passes_for": widened,  # (target, trace): both of a run's passes left out
    }
    return whole, lambda target, trace: models[(target, trace)], report
