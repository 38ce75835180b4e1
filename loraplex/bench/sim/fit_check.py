"""Whether a full calibration's step fit holds together (``sim calibrate``; docs/simulator.md,
"SIMCAL2"). ``--calibrate-interleaved`` leaves out a pass whose own fit does not
(``interleaved.disturbed_passes``); a full calibration has no other passes to fall back on, so
``calibration.calibrate`` re-measures its step samples once and, if the fit still fails, refuses
to return the model (``BrokenFit``) unless the operator accepts it explicitly.

The bounds were read from the kept cost files' own fits (docs/benchmarks/sim-cost-*, 2026-12-02
to 12-05, 33 full calibrations): the fits with R^2 below 0.60 (0.558-0.588, four) stand apart
from the rest (0.702 and up), and a largest residual of 147x to 801x (a decode mix timed at
6-27 us a token, a TPOT no step can have) stands apart from every other (2.35x at most)."""

from __future__ import annotations

from typing import Any

from loraplex.sim.calibrate import StepFit

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


def check_text(checks: list[list[str]], accepted: bool) -> str:
    """The ``fit_check`` source: the bounds, and each measurement's faults in order."""
    head = (
        f"the step fit checked (bench/sim/fit_check.py: {' / '.join(TOKEN_PRICES)} fitted to 0, "
        f"R^2 below {MIN_STEP_R_SQUARED}, largest residual beyond {MAX_STEP_REL_RESIDUAL:.0%}): "
    )
    if not checks[0]:
        return head + "held"
    text = head + "the first measurement failed (" + "; ".join(checks[0]) + "), the step "
    if not checks[-1]:
        return text + "samples were re-measured once and held"
    text += "samples were re-measured once and failed again (" + "; ".join(checks[-1]) + ")"
    return text + ("; kept by --accept-broken-fit" if accepted else "; not written")


class BrokenFit(ValueError):
    """A calibration whose step fit failed twice: what failed, and the report (to keep it)."""

    def __init__(self, faults: list[str], report: dict[str, Any]) -> None:
        super().__init__(
            "the step fit does not hold together after the step samples were re-measured once: "
            + "; ".join(faults)
        )
        self.faults = faults
        self.report = report
