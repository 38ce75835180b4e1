"""Whether a full calibration's step fit holds together (``sim calibrate``; docs/simulator.md,
"SIMCAL2"). ``--calibrate-interleaved`` leaves out a pass whose own fit does not
(``interleaved.disturbed_passes``); a full calibration has no other passes to fall back on, so
``calibration.calibrate`` re-measures its step samples once and, if the fit still fails, refuses
to return the model (``BrokenFit``) unless the operator accepts it explicitly.
``sim calibrate-fleet`` does the same with its own fit (``fleet_fit_faults``: a fresh fleet
measured once more), and refuses a base whose recorded step fit fails (``recorded_step_fit``).

The bounds were read from the kept cost files' own fits (docs/benchmarks/sim-cost-*, 2026-12-02
to 12-05, 33 full calibrations): the fits with R^2 below 0.60 (0.558-0.588, four) stand apart
from the rest (0.702 and up), and a largest residual of 147x to 801x (a decode mix timed at
6-27 us a token, a TPOT no step can have) stands apart from every other (2.35x at most)."""

from __future__ import annotations

import re
from typing import Any

from loraplex.sim.calibrate import Fit, StepFit
from loraplex.sim.calibrate_fleet import FleetFit
from loraplex.sim.cost_model import CostModel

TOKEN_PRICES = ("per_token_s", "per_prefill_token_s")  # fitted to 0: the fit put them elsewhere
MIN_STEP_R_SQUARED = 0.65  # in the gap between 0.588 and 0.702 (module docstring)
MAX_STEP_REL_RESIDUAL = 10.0  # 1000 %: in the gap between 2.35x and 147x (module docstring)


def step_fit_faults(fitted: StepFit) -> list[str]:
    """Why ``fitted`` does not hold together (empty: it does): a token price (``TOKEN_PRICES``)
    fitted to 0, an R^2 below ``MIN_STEP_R_SQUARED``, or a largest relative residual beyond
    ``MAX_STEP_REL_RESIDUAL``. An undefined R^2 (samples that do not vary) is not a fault."""
    out = []
    for name in TOKEN_PRICES:
        price = getattr(fitted.step, name)
        if price is not None and price <= 0:
            out.append(f"{name} fitted to 0")
    r2 = fitted.fit.r_squared
    if r2 is not None and r2 < MIN_STEP_R_SQUARED:
        out.append(f"R^2 {r2:.4f} below {MIN_STEP_R_SQUARED}")
    worst = fitted.fit.max_rel_residual
    if worst > MAX_STEP_REL_RESIDUAL:
        out.append(f"largest residual {worst:.1%} beyond {MAX_STEP_REL_RESIDUAL:.0%}")
    return out


STEP_RULES = (
    f"{' / '.join(TOKEN_PRICES)} fitted to 0, R^2 below {MIN_STEP_R_SQUARED}, largest residual "
    f"beyond {MAX_STEP_REL_RESIDUAL:.0%}"
)
FLEET_RULES = "network_s fitted to 0 (its raw median below 0)"
RECORDED = re.compile(r"R\^2 ([0-9.]+), largest residual ([0-9.]+)%")


def recorded_step_fit(model: CostModel) -> StepFit | None:
    """A cost-model file's step fit as recorded: its prices, and the R^2 and largest residual
    its ``sources.step`` states (None: it states none)."""
    found = RECORDED.findall(model.sources.get("step", ""))
    if not found:
        return None
    r2, worst = found[-1]
    return StepFit(model.step, model.ipc_s, Fit((), float(r2), float(worst) / 100))


def fleet_fit_faults(fit: FleetFit) -> list[str]:
    """Why a fleet calibration's fit does not hold together (empty: it does): its ``network_s``
    floored at 0, the fleet's lone requests faster than the base's lone ones predict (kept
    fleet files: 3.7-19.2 ms; -0.45 and -29.9 ms only over bases the step check refuses)."""
    if fit.raw_network_s < 0:
        return [f"network_s fitted to 0 (raw median {fit.raw_network_s * 1000:.2f} ms)"]
    return []


def check_text(checks: list[list[str]], accepted: bool, rules: str, again: str) -> str:
    """The ``fit_check`` source: the rules, and each measurement's faults in order (``again``:
    what was measured once more)."""
    head = f"checked (bench/sim/fit_check.py: {rules}): "
    if not checks[0]:
        return head + "held"
    text = head + "the first measurement failed (" + "; ".join(checks[0]) + "), " + again
    if not checks[-1]:
        return text + " measured once more and held"
    text += " measured once more and failed again (" + "; ".join(checks[-1]) + ")"
    return text + ("; kept by --accept-broken-fit" if accepted else "; not written")


class BrokenFit(ValueError):
    """A calibration whose step fit failed twice: what failed, and the report (to keep it)."""

    def __init__(self, faults: list[str], report: dict[str, Any], what: str = "step") -> None:
        super().__init__(
            f"the {what} fit does not hold together after its samples were measured once "
            "more: " + "; ".join(faults)
        )
        self.faults = faults
        self.report = report
