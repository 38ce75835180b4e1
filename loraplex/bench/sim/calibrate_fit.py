"""A calibration's fit: the cost model of a calibration's measurements (``calibration.measure``'s,
or several passes' merged by ``interleaved.merged``) and its sources (the command, the date and
the machine, and how each part was measured and fitted), with the report of what was measured."""

from __future__ import annotations

import datetime
import platform
import statistics
from dataclasses import asdict, replace
from typing import Any

from loraplex.bench.harness.machine import machine_record
from loraplex.bench.sim.calibrate_busy import TRACE_MIX, busy_scale, copy_medians
from loraplex.bench.sim.calibrate_cold import LeaseHandoffs, handoff_seconds
from loraplex.bench.sim.calibrate_decode import decode_clock_text, decode_report
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import Target
from loraplex.sim.calibrate import (
    FIRST_SIZE_RATIO,
    FirstFit,
    Fit,
    HopBusyFit,
    calibrated_model,
    fit_hop_busy,
    fit_link,
    jitter_quantiles,
)
from loraplex.sim.cost_model import FIRST_KEYS, LINKS, CostModel
from loraplex.sim.host_speed import HostProbe

SHARED_CPU = (
    "the target's: a CPU-only server (the --self demo server, torch_threads 1) runs its "
    "loader and its engine on the same core, so loads delay steps"
)


def _cpu(cpu: object) -> str:
    if isinstance(cpu, dict):
        return f"{cpu.get('model', 'unknown CPU')} ({' '.join(cpu.get('isa', []))})"
    return str(cpu)


def _fit_text(fit: Fit, samples: int) -> str:
    r2 = "undefined" if fit.r_squared is None else f"{fit.r_squared:.4f}"
    return f"{samples} samples, R^2 {r2}, largest residual {fit.max_rel_residual:.1%}"


def _step_text(measured: dict[str, Any], config: CalibrateConfig, decodes: int, shapes: str) -> str:
    """How the step line was measured and fitted (its ``sources`` entry, less the fit's figures)."""
    lengths = list(config.prefill_lengths)
    prefills = len(measured["steps"]) - decodes
    head = (
        f"median TPOT of {decodes} controlled decode mixes ("
        + decode_clock_text(measured["decode_mixes"])
        + ") and "
    )
    tail = f" over adapters of {shapes}, "
    if measured["step_fit"].ipc_s is None:
        requests = sum(len(t.steps_s) for t in measured["timings"])
        return (
            head + "the median first engine step (the request log's scheduled_s to "
            f"first_step_end_s) of lone warm requests at prompt lengths {lengths} ({prefills} "
            f"samples of {requests} requests; bench/sim/calibrate_timeline.py)"
            + tail
            + "fitted by non-negative least squares with a per-prefill-step term "
            "(per_prefill_step_s): "
        )
    return (
        head + f"median TTFT less front_s of lone warm requests at prompt lengths {lengths} "
        f"({prefills} samples; bench/sim/calibrate_prefill.py)"
        + tail
        + "fitted together with ipc_s by non-negative least squares: "
    )


def _shapes(target: Target, sizes: dict[str, int]) -> str:
    """The measured adapters' shapes, e.g. ``ranks [8, 64] x 2 target sets (bytes per rank)``;
    ``sizes``: the bytes ``measure`` read for adapters ``target`` gives none of (``--url``).
    NOTE: a remote server's adapters were sized on a copy of the target inside ``measure``, and
    this read the unsized one: ``x 0 target sets`` under ``--url`` (newop4)."""
    ranks = sorted({a.rank for a in target.adapters})
    widths = set()
    for adapter in target.adapters:
        size = adapter.size_bytes if adapter.size_bytes > 0 else sizes.get(adapter.ref, 0)
        if size > 0:
            widths.add(size / adapter.rank)
    if not widths:
        return f"ranks {ranks} (their bytes not known: target sets not counted)"
    return f"ranks {ranks} x {len(widths)} target sets (bytes per rank)"


def _lease_handoffs(found: LeaseHandoffs | None) -> tuple[dict[str, float], str]:
    """``lease_handoff_s`` and its source text; L2, when no lone request waited for a load from
    it, takes L1's value (the path L2 -> L1 -> L0 ends in the same copy and hand-off)."""
    if found is None:
        return {}, (
            "not measured: no engine timelines (a remote server's request log is not read, or "
            "no lone request waited for a load); the TTFT-based hand-offs are on the links"
        )
    seconds = dict(found.seconds)
    parts = [
        f"{tier} {seconds[tier] * 1000:.2f} ms ({found.counts[tier]} requests)" for tier in seconds
    ]
    if "L2" not in seconds and "L1" in seconds:
        seconds["L2"] = seconds["L1"]
        parts.append("L2 not measured (no lone request found its adapter in L2 alone): L1's value")
    text = (
        "the engine's timelines of the calibration's lone requests (the server's request log): "
        "per tier a lease waited for a load from, the median of the plan of the request's first "
        "step less its ask (asked_s, lease_ask_s) and its load's stage seconds, less the median "
        f"plan after the ask of {found.at_once} lone requests leased at once "
        f"({found.at_once_plan_s * 1000:.2f} ms; bench/sim/calibrate_cold.lease_handoffs): "
        + ", ".join(parts)
    )
    return seconds, text


def _lease_ask(found: LeaseHandoffs | None) -> tuple[float, str]:
    """``lease_ask_s`` and its source text (0 without engine timelines: the ask then stays in
    the TTFT-based hand-offs)."""
    if found is None:
        return 0.0, "not measured: no engine timelines (see lease_handoff_s)"
    waited = sum(found.counts.values())
    return found.ask_s, (
        f"the median ask (the engine's asked_s) of {waited} lone requests whose lease waited for "
        f"a load less that of {found.at_once} leased at once "
        f"({found.at_once_ask_s * 1000:.2f} ms), floored at 0 "
        "(bench/sim/calibrate_cold.lease_handoffs)"
    )


def _hop_busy_text(fit: HopBusyFit) -> str:
    """``hop_busy_s``'s source text."""
    if fit.busy_median_s is None or fit.lone_median_s is None:
        return (
            f"not measured (no server request log, or no request of one kind: {fit.busy} "
            f"arrived busy, {fit.lone} alone): 0"
        )
    return (
        "the calibration's server request log(s): the median time outside the engine (ttft_s "
        f"less first_step_end_s) of the {fit.busy} requests that arrived while another was in "
        f"flight, {fit.busy_median_s * 1e3:.2f} ms, less that of the {fit.lone} that arrived "
        f"alone, {fit.lone_median_s * 1e3:.2f} ms, floored at 0 (bench/sim/calibrate_cold."
        "hop_samples, sim/calibrate.fit_hop_busy; each server's first request left out)"
    )


def first_seconds(fits: list[FirstFit]) -> tuple[dict[str, float], dict[str, str]]:
    """``first_load_s``, ``first_step_s``, ``first_hop_s`` and their source texts from each
    fresh server's fit (one per calibration pass, ``calibrate_cold.first_requests``): with one
    measured, its excesses; with several, each key's median over them; with none, 0 and why."""
    measured = [f for f in fits if not f.reason and f.first is not None]
    if not measured:
        why = "; ".join(dict.fromkeys(f.reason for f in fits)) or "no fresh server was measured"
        return dict.fromkeys(FIRST_KEYS, 0.0), dict.fromkeys(FIRST_KEYS, f"not measured (0): {why}")
    stage = {
        "first_load_s": "its load's stage seconds (engine.load_s)",
        "first_step_s": "its first step, planned to ended (scheduled_s to first_step_end_s)",
        "first_hop_s": "its TTFT outside the engine (ttft_s less first_step_end_s)",
    }
    seconds, texts = {}, {}
    for key in FIRST_KEYS:
        values = [f.seconds[key] for f in measured]
        seconds[key] = statistics.median(values)
        parts = ", ".join(
            f"{f.seconds[key] * 1e3:.2f} ms ({f.first.adapter if f.first else '?'} against "
            f"{len(f.later)})"
            for f in measured
        )
        if key == "first_load_s" and any(f.loads for f in measured):
            parts = ", ".join(
                f"{f.seconds[key] * 1e3:.2f} ms ({len(f.loads) - 1} later)" for f in measured
            )
            texts[key] = (
                "the calibration's fresh server's first load (the first L3 -> L2 load sample, "
                "timed before any request, so the first request's load is not the process's "
                "first) less the median of its later L3 -> L2 load samples within "
                f"{FIRST_SIZE_RATIO:g}x its bytes, floored at 0 (sim/calibrate.with_first_load; "
                + ("the median over passes: " if len(measured) > 1 else "")
                + parts
                + "; samples in the report's first_requests[].loads)"
            )
            continue
        texts[key] = (
            f"the calibration's fresh server's first request (a lone cold one), {stage[key]} "
            "less the median of the same server's later lone cold requests of an adapter within "
            f"{FIRST_SIZE_RATIO:g}x its size, floored at 0 "
            "(bench/sim/calibrate_cold.first_requests; "
            + ("the median over passes: " if len(measured) > 1 else "")
            + parts
            + "; samples in the report's first_requests)"
        )
    return seconds, texts


def cost_model_from(
    target: Target,
    config: CalibrateConfig,
    measured: dict[str, Any],
    *,
    probes: list[HostProbe],
    hardware: str,
    command: str,
) -> tuple[CostModel, dict[str, Any]]:
    """``calibrate``'s fit of ``measured`` (``measure``'s, or several passes' merged by
    ``interleaved.merged``) with the host ``probes`` timed around it: the cost model and report."""
    load_cpu_shared = target.load_cpu_shared
    probe = HostProbe(
        statistics.mean(p.matmul_s for p in probes), statistics.mean(p.loop_s for p in probes)
    )
    loads, steps, fitted = measured["loads"], measured["steps"], measured["step_fit"]
    decodes = sum(1 for s in steps if not s.prefill_tokens)
    machine = machine_record()
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    sources = {
        "command": command,
        "date": when,
        "machine": f"{_cpu(machine['cpu'])}, {machine['cores']} cores, load "
        f"{machine['load_1m']} at the end, host {platform.node() or 'unknown'}",
        "step": _step_text(measured, config, decodes, _shapes(target, measured.get("sizes", {})))
        + _fit_text(fitted.fit, len(steps)),
        "front_s": "median latency of an authenticated GET /v1/models",
        "ipc_s": (
            f"the median over {len(measured['lone'])} lone warm requests of their TTFT less "
            "front_s less the fitted step's price of their prompt and adapter "
            "(sim/calibrate.median_hop_s; "
            + (
                "the prefill samples are engine-timed steps, which hold no hop)"
                if fitted.ipc_s is None
                else "the fit's own hop term moves whole when a few samples are disturbed)"
            )
            if measured["lone"]
            else "fitted with the step: the hop term of the lone requests' TTFT less front_s"
        ),
        "network_s": "not measured: one server, no ingress-to-replica hop (0)",
        "load_cpu_shared": SHARED_CPU if load_cpu_shared else "not shared (the target's)",
        "host_probe": (
            "bench/sim/host_probe.py timed in the calibrating process before and after the "
            "measurements (sums "
            + ", ".join(f"{p.total_s:.4f}" for p in probes)
            + " s); their mean per part"
        ),
    }
    for link in LINKS:
        mine = [s for s in loads if s.link == link]
        fit_text = (
            _fit_text(fit_link(mine)[1], len(mine)) if len({s.nbytes for s in mine}) > 1 else ""
        )
        dropped = ", the store's cached pages dropped before each" if target.store else ""
        sources[f"links.{link}"] = (
            f"cold loads timed by the server's stage counters{dropped}; {fit_text}"
        )
    stores = [s for s in measured["cold"] if s.tier == "L3"]
    copies = [s for s in measured["cold"] if s.tier == "L1"]
    copy_handoff_s = handoff_seconds(copies)
    store_handoff_s = handoff_seconds(stores)
    handoff_s = max(0.0, store_handoff_s - copy_handoff_s)  # L3's path passes L1 -> L0 too
    ttft_based = (
        f"{copy_handoff_s * 1000:.2f} ms, the median over {len(copies)} lone requests, the "
        "adapter only in L1, of their TTFT less the same adapter's warm TTFT and the copy's stage "
        "seconds (hand-offs no stage counter holds; bench/sim/calibrate_cold.py)",
        f"{handoff_s * 1000:.2f} ms: the median over {len(stores)} lone cold requests (the "
        "adapter only in L3) of their TTFT less the same adapter's warm TTFT and the load's stage "
        f"seconds, {store_handoff_s * 1000:.2f} ms, less the L1 -> L0 link's hand-off (floored "
        "at 0; bench/sim/calibrate_cold.py)",
    )
    lease_found = measured.get("handoffs")  # None: no engine timelines
    lease_handoff_s, timeline_text = _lease_handoffs(lease_found)
    sources["lease_handoff_s"] = timeline_text
    lease_ask_s, sources["lease_ask_s"] = _lease_ask(lease_found)
    if lease_handoff_s:  # the engine's timelines replace the TTFT-based figures (same wait)
        copy_handoff_s = handoff_s = 0.0
        sources["links.L1_to_L0"] += (
            "; the TTFT-based hand-off, "
            + ttft_based[0]
            + (", is not added: lease_handoff_s charges that wait")
        )
        sources["links.L3_to_L2"] += (
            "; the TTFT-based hand-off, "
            + ttft_based[1]
            + (", is not added: lease_handoff_s charges that wait")
        )
    else:
        sources["links.L1_to_L0"] += "; fixed_s includes " + ttft_based[0]
        sources["links.L3_to_L2"] += "; fixed_s includes " + ttft_based[1]
    residuals = measured["residuals"]
    jitter = jitter_quantiles(residuals) if len(residuals) >= 2 else ()
    sources["hop_jitter_s"] = (
        f"quantiles (every 5 %) of {len(residuals)} lone warm requests' TTFT less the median of "
        "their prompt length and adapter (the prefill samples above); one drawn per request"
        if jitter
        else "not measured (fewer than two lone warm requests): every hop the same"
    )
    busy = measured["busy"]
    scale = busy_scale(busy)
    sources["load_busy_scale"] = (
        "not measured (no cold load was timed beside running steps): 1, loads cost their lone price"
        if scale is None
        else f"the median over {len(busy)} samples (an adapter loaded from the store, its "
        "cached pages dropped) of the load's stage seconds before the copy with "
        f"{TRACE_MIX.describe()} beside it over the same load alone (ratios "
        + ", ".join(f"{b.ratio:.2f}" for b in busy)
        + "; bench/sim/calibrate_busy.py)"
    )
    copy_times = copy_medians(busy)
    sources["copy_waits_for_step"] = (
        "not measured: how loraplex's engine is built (engine/factory.py: slot fills and "
        "forwards take one slot lock), so a copy into a slot that starts during a step starts "
        "when it ends; "
        + (
            "no copy was timed beside steps here"
            if copy_times is None
            else f"the copies of the loads above took a median {copy_times[1] * 1e3:.2f} ms "
            f"beside steps against {copy_times[0] * 1e3:.2f} ms alone (the server's copy stage "
            "counter, which times the wait for the lock too)"
        )
    )
    overheads = {"front_s": measured["front_s"], "network_s": 0.0}
    model = calibrated_model(
        hardware,
        steps,
        loads,
        overheads,
        sources,
        load_cpu_shared=load_cpu_shared,
        load_handoff_s=handoff_s,
        copy_handoff_s=copy_handoff_s,
        hop_jitter_s=jitter,
        lease_handoff_s=lease_handoff_s,
        lone_hops=measured["lone"],
    )
    busy_price = 1.0 if scale is None else scale
    firsts: list[FirstFit] = measured.get("first", [])
    first_s, first_texts = first_seconds(firsts)
    hop_busy = fit_hop_busy(measured.get("hop_busy", []))
    model = replace(
        model,
        sources={**model.sources, **first_texts, "hop_busy_s": _hop_busy_text(hop_busy)},
        first_load_s=first_s["first_load_s"],
        first_step_s=first_s["first_step_s"],
        first_hop_s=first_s["first_hop_s"],
        hop_busy_s=hop_busy.seconds,
        host_probe=probe,
        load_busy_scale=busy_price,
        lease_ask_s=lease_ask_s,
        copy_waits_for_step=True,
    )
    report = {
        "hardware": hardware,
        "step_samples": [asdict(s) for s in steps],
        # each decode mix's runs: TPOTs on the engine's and the client's clocks, what was left out
        "decode_mixes": [asdict(m) for m in measured["decode_mixes"]],
        "decode_clock": decode_report(measured["decode_mixes"]),
        # the lone requests' TTFT-based samples, also when the fit took engine-timed ones
        # (so the older fit can be redone from the same run), and the engine's timings
        "ttft_prefill_samples": [asdict(s) for s in measured["ttft_prefills"]],
        "prefill_timeline": [
            {
                "adapter": t.adapter.ref,
                "rank": t.adapter.rank,
                "prompt_tokens": t.prompt_tokens,
                "steps_s": list(t.steps_s),
                "sample": asdict(sample),
            }
            for t, sample in zip(measured["timings"], measured["timed"], strict=True)
        ],
        "load_samples": [asdict(s) for s in loads],
        "cold_samples": [{**asdict(s), "handoff_s": s.handoff_s} for s in measured["cold"]],
        "busy_samples": [{**asdict(s), "ratio": s.ratio} for s in busy],
        "overheads": {**overheads, "ipc_s": model.ipc_s},
        "hop_residuals_s": residuals,
        "lone_ttfts_s": [[asdict(sample), ttft_s] for sample, ttft_s in measured["lone"]],
        "lease_handoffs": None if lease_found is None else asdict(lease_found),
        # each fresh server's first request and the later lone cold requests it was set against
        "first_requests": [asdict(f) for f in firsts],
        "hop_busy": asdict(hop_busy),  # the medians hop_busy_s is the difference of
        "machine": machine,
        "host_probes": [asdict(p) for p in probes],
        "target": target.url,
    }
    return model, report
