"""One calibration: measure a target, then fit (``calibrate_fit.cost_model_from``) and write the
cost model with its sources (the command, the date and the machine, and how each part was
measured and fitted)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.sim.calibrate_busy import busy_samples
from loraplex.bench.sim.calibrate_cold import (
    cold_samples,
    first_requests,
    hop_samples,
    lease_handoffs,
)
from loraplex.bench.sim.calibrate_decode import step_samples
from loraplex.bench.sim.calibrate_fit import cost_model_from
from loraplex.bench.sim.calibrate_loads import load_samples, with_sizes
from loraplex.bench.sim.calibrate_prefill import prefill_adapters, prefill_samples
from loraplex.bench.sim.calibrate_run import (
    CalibrateConfig,
    front_seconds,
    weight_regressors,
)
from loraplex.bench.sim.calibrate_target import Target
from loraplex.bench.sim.calibrate_timeline import (
    PrefillTiming,
    log_size,
    prefill_timings,
    timed_samples,
    wait_for_lines,
)
from loraplex.bench.sim.fit_check import STEP_RULES, BrokenFit, check_text, step_fit_faults
from loraplex.bench.sim.host_probe import host_probe
from loraplex.sim.calibrate import FirstFit, LoadSample, fit_first, fit_step, with_first_load
from loraplex.sim.cost_model import CostModel


def measure(target: Target, config: CalibrateConfig) -> dict[str, Any]:
    """Every sample of one calibration: loads and cold requests end to end first (adapters
    still cold; ``calibrate_cold``), cold loads alone and beside running steps
    (``calibrate_busy``), then the step samples (``_step_measurements``)."""
    with _client(target, config) as client:
        loads = load_samples(client, target.adapters, target.store)
        # While every adapter is still cold and no warm policy holds one (they drop nothing
        # pinned later, after the mixes' traffic).
        cold = cold_samples(client, target, config)
        cold += cold_samples(client, target, config, tier="L1")
        busy = busy_samples(client, target, config)  # loads beside steps (load_busy_scale)
        target = with_sizes(client, target)
        steps = _step_measurements(client, target, config)
    logged = _log_handoffs(target)
    # one per server (passes merge them)
    first = _first_requests(target, logged["log_lines"], loads)
    sizes = {a.ref: a.size_bytes for a in target.adapters}  # as read (``with_sizes``)
    return {
        "loads": loads, "cold": cold, "busy": busy, **steps, **logged, "first": [first],
        "sizes": sizes,
    }  # fmt: skip


NOT_FRESH = (
    "not measured: the server was not started by this calibration (--url), so it is not fresh "
    "(its first requests were served before) and its request log is not read"
)


def _first_requests(
    target: Target, lines: list[dict[str, Any]], loads: list[LoadSample]
) -> FirstFit:
    """A fresh server's first-request excesses (``calibrate_cold.first_requests``), the load's
    from its first load sample (``loads``, timed before any request: ``with_first_load``): only
    a server this calibration started (``--self``, the one case with ``request_log`` set) is
    fresh; any other gives 0 with the reason."""
    if target.request_log is None:
        return fit_first(None, (), NOT_FRESH)
    fit = first_requests(lines, {a.ref: a.size_bytes for a in target.adapters})
    return with_first_load(fit, loads)


def remeasure_steps(
    target: Target, config: CalibrateConfig, measured: dict[str, Any]
) -> dict[str, Any]:
    """``measured`` with its step samples measured again (``_step_measurements``: decode mixes,
    front_s, the prefill samples and the step fit); the loads and cold requests stay (their
    adapters are no longer cold)."""
    with _client(target, config) as client:
        steps = _step_measurements(client, with_sizes(client, target), config)
    return {**measured, **steps, **_log_handoffs(target)}


def _client(target: Target, config: CalibrateConfig) -> httpx.Client:
    headers = {"Authorization": f"Bearer {target.admin_key}"}
    return httpx.Client(base_url=target.url, headers=headers, timeout=config.request_timeout_s)


def _step_measurements(
    client: httpx.Client, target: Target, config: CalibrateConfig
) -> dict[str, Any]:
    """Decode mixes, front_s and the prefill samples (which need front_s), and the step fit: on
    the prefill steps the engine's timeline holds when the server's request log is at hand
    (``calibrate_timeline``), else on the lone TTFTs."""
    steps, decode_mixes = step_samples(client, target, config)
    front_s = front_seconds(client, target, config)
    log_from = log_size(target.request_log)
    prefills, residuals, lone = prefill_samples(client, target, config, front_s)
    timings: list[PrefillTiming] = []
    if target.request_log is not None and target.request_log.is_file():
        timings = _timings(target.request_log, target, config, log_from)
    timed = timed_samples(timings, {a: weight_regressors((a,)) for a in target.adapters})
    # fewer than two prompt lengths timed: the prompt-token term would not be identified
    steps += timed if len({t.prompt_tokens for t in timings}) > 1 else prefills
    return {
        "steps": steps,
        "decode_mixes": decode_mixes,  # every mix's runs, on their clocks (calibrate_decode.py)
        "ttft_prefills": prefills,
        "timings": timings,
        "timed": timed,  # one step sample per timing, in order
        "step_fit": fit_step(steps),
        "front_s": front_s,
        "residuals": residuals,
        "lone": lone,
    }


def _log_handoffs(target: Target) -> dict[str, Any]:
    """The lease hand-offs of the server's request log (None: no log), its lines (merged
    passes redo the hand-offs) and its hop samples (``hop_busy_s``; per server: each log has
    its own clock)."""
    if target.request_log is None or not target.request_log.is_file():
        return {"handoffs": None, "log_lines": [], "hop_busy": []}
    text = target.request_log.read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines() if line]
    return {"handoffs": lease_handoffs(lines), "log_lines": lines, "hop_busy": hop_samples(lines)}


def _timings(
    log: Path, target: Target, config: CalibrateConfig, log_from: int
) -> list[PrefillTiming]:
    """The prefill samples' lone requests on the engine's timeline (``log``'s lines from
    ``log_from``, where the prefill samples began)."""
    groups = [(a, n) for a in prefill_adapters(target) for n in config.prefill_lengths]
    expected = len(groups) * config.overhead_requests
    lines = wait_for_lines(log, log_from, expected, config.hop_output_tokens)
    return prefill_timings(lines, groups, config.hop_output_tokens)


def calibrate(
    target: Target,
    config: CalibrateConfig,
    hardware: str,
    command: str,
    *,
    accept_broken_fit: bool = False,
) -> tuple[CostModel, dict[str, Any]]:
    """The validated cost model of ``target`` and a report of what was measured;
    ``load_cpu_shared`` is the target's (``Target.load_cpu_shared``: a CPU-only server's loader
    and engine share one CPU). A step fit that does not hold together (``fit_check``) has its
    step samples re-measured once; failing again it raises ``BrokenFit`` (with the report)
    unless ``accept_broken_fit``. The checks are in the model's ``sources`` and the report."""
    probes = [host_probe()]  # the host's speed around the figures (sim/host_speed.py)
    measured = measure(target, config)
    checks = [step_fit_faults(measured["step_fit"])]
    first = measured["steps"], measured["decode_mixes"]  # kept in the report when measured again
    if checks[0]:
        measured = remeasure_steps(target, config, measured)
        checks.append(step_fit_faults(measured["step_fit"]))
    probes.append(host_probe())
    model, report = cost_model_from(
        target, config, measured, probes=probes, hardware=hardware, command=command
    )
    text = "the step fit " + check_text(checks, accept_broken_fit, STEP_RULES, "the step samples")
    model = replace(model, sources={**model.sources, "fit_check": text})
    report["fit_check"] = {"measurements": checks, "accepted": accept_broken_fit, "text": text}
    if len(checks) > 1:  # the first measurement's step samples, which the model does not use
        report["fit_check"]["first_step_samples"] = [asdict(s) for s in first[0]]
        report["fit_check"]["first_decode_mixes"] = [asdict(m) for m in first[1]]
    if checks[-1] and not accept_broken_fit:
        raise BrokenFit(checks[-1], report)
    return model, report
