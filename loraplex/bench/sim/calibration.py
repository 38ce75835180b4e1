"""One calibration: measure a target, then fit (``calibrate_fit.cost_model_from``) and write the
cost model with its sources (the command, the date and the machine, and how each part was
measured and fitted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.sim.calibrate_cold import cold_samples, lease_handoffs
from loraplex.bench.sim.calibrate_fit import cost_model_from
from loraplex.bench.sim.calibrate_loads import load_samples, with_sizes
from loraplex.bench.sim.calibrate_prefill import prefill_adapters, prefill_samples
from loraplex.bench.sim.calibrate_run import (
    CalibrateConfig,
    front_seconds,
    step_samples,
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
from loraplex.bench.sim.host_probe import host_probe
from loraplex.sim.calibrate import fit_step
from loraplex.sim.cost_model import CostModel


def measure(target: Target, config: CalibrateConfig) -> dict[str, Any]:
    """Every sample of one calibration: loads and cold requests end to end first (adapters
    still cold; ``calibrate_cold``), then decode mixes, front_s and the prefill samples (which
    need front_s), and the step fit: on the prefill steps the engine's timeline holds when the
    server's request log is at hand (``calibrate_timeline``), else on the lone TTFTs."""
    headers = {"Authorization": f"Bearer {target.admin_key}"}
    with httpx.Client(
        base_url=target.url, headers=headers, timeout=config.request_timeout_s
    ) as client:
        loads = load_samples(client, target.adapters, target.store)
        # While every adapter is still cold and no warm policy holds one (they drop nothing
        # pinned later, after the mixes' traffic).
        cold = cold_samples(client, target, config)
        cold += cold_samples(client, target, config, tier="L1")
        target = with_sizes(client, target)
        steps = step_samples(client, target, config)
        front_s = front_seconds(client, target, config)
        log_from = log_size(target.request_log)
        prefills, residuals, lone = prefill_samples(client, target, config, front_s)
    handoffs, timings, lines = None, [], []
    if target.request_log is not None and target.request_log.is_file():
        timings = _timings(target.request_log, target, config, log_from)
        text = target.request_log.read_text(encoding="utf-8")
        lines = [json.loads(line) for line in text.splitlines() if line]
        handoffs = lease_handoffs(lines)
    timed = timed_samples(timings, {a: weight_regressors((a,)) for a in target.adapters})
    # fewer than two prompt lengths timed: the prompt-token term would not be identified
    steps += timed if len({t.prompt_tokens for t in timings}) > 1 else prefills
    return {
        "loads": loads,
        "steps": steps,
        "ttft_prefills": prefills,
        "timings": timings,
        "timed": timed,  # one step sample per timing, in order
        "step_fit": fit_step(steps),
        "front_s": front_s,
        "cold": cold,
        "residuals": residuals,
        "lone": lone,
        "handoffs": handoffs,
        "log_lines": lines,  # the server's request log (merged passes redo the hand-offs)
    }


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
) -> tuple[CostModel, dict[str, Any]]:
    """The validated cost model of ``target`` and a report of what was measured;
    ``load_cpu_shared`` is the target's (``Target.load_cpu_shared``: a CPU-only server's loader
    and engine share one CPU)."""
    probes = [host_probe()]  # the host's speed around the figures (sim/host_speed.py)
    measured = measure(target, config)
    probes.append(host_probe())
    return cost_model_from(
        target, config, measured, probes=probes, hardware=hardware, command=command
    )
