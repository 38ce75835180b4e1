"""Prefill steps on the engine's own timeline: the calibration's lone warm requests as the server's
request log (``server/request_log.py``) records them, each one's first step from its plan to its
end (``engine.first_step_end_s - engine.scheduled_s``), one sample per prompt length and adapter;
and the decode mixes' requests' TPOT on the same clock (``decode_tpots``, calibrate_decode.py).

Why not their TTFT: a lone request's TTFT less ``front_s`` is one prefill step plus the hop, and
fitted that way a per-prefill-step term and the hop are one column, so whatever a prefill step
costs beyond the decode line's price of its tokens (6.5-7.8 ms against 3.9-4.4 ms priced,
docs/simulator.md, SIMWARM) was charged to every request as hop instead of to the steps, and the
requests queued behind them, that pay it. The engine's clock also leaves the client's segment,
which a disturbed calibration moved by up to 20 ms (SIMWARM's V9), out of the step.

NOTE: a step's plan-to-end misses the part of the engine loop before the plan stamps the request
(expiry, leases, the first part of ``schedule``) and after the step (the scheduler's update, the
token's hand-off), which a decode sample's TPOT holds; the fit's prefill-step term comes out
that much low, and the hop (a median beyond the fitted step) takes it back.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.bench.sim.calibrate_target import ServedAdapter
from loraplex.sim.calibrate import StepSample

LOG_WAIT_S = 2.0  # how long to wait for the last lone requests' lines to reach the log


@dataclass(frozen=True)
class PrefillTiming:
    """The engine's first steps of one prefill sample's lone warm requests."""

    adapter: ServedAdapter  # the adapter they named
    prompt_tokens: int  # their prompt length
    steps_s: tuple[float, ...]  # each request's first step, planned to ended, in log order

    @property
    def median_s(self) -> float:
        return statistics.median(self.steps_s)


def log_size(path: Path | None) -> int:
    """The log's bytes now (0 when absent): where the lines of what is sent next begin."""
    return path.stat().st_size if path is not None and path.is_file() else 0


def log_lines(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The log's lines from byte ``offset`` (one JSON object each)."""
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def first_step_s(line: Mapping[str, Any]) -> float | None:
    """A logged request's first engine step, planned to ended; None without a timeline."""
    engine = line.get("engine")
    if not isinstance(engine, dict):
        return None
    start, end = engine.get("scheduled_s"), engine.get("first_step_end_s")
    if start is None or end is None or end <= start:
        return None
    return float(end) - float(start)


def decode_tpot_s(line: Mapping[str, Any]) -> float | None:
    """A logged request's time per output token on the engine's clock: its end less its first
    step's end (its first token), over its tokens after the first; None without a timeline or
    under 2 tokens. Both are stamped after a step's forward, so this spans whole engine steps
    (the plan, the forward, the update) as the client's TPOT does, without the client's reads."""
    engine, tokens = line.get("engine"), line.get("output_tokens")
    if not isinstance(engine, dict) or not isinstance(tokens, int) or tokens < 2:
        return None
    first, end = engine.get("first_step_end_s"), engine.get("end_s")
    if first is None or end is None or end < first:
        return None
    return (float(end) - float(first)) / (tokens - 1)


def decode_tpots(
    lines: Sequence[Mapping[str, Any]], prompt_tokens: int, output_tokens: int
) -> list[float]:
    """``decode_tpot_s`` of the logged requests of a decode mix's shape (``prompt_tokens`` in,
    all ``output_tokens`` out: finished by ``length``, as ``ignore_eos`` runs them), in log
    order; requests that ended otherwise (an error, an abort) give none."""
    out = []
    for line in lines:
        if line.get("outcome") != "length" or line.get("prompt_tokens") != prompt_tokens:
            continue
        if line.get("output_tokens") != output_tokens:
            continue
        tpot = decode_tpot_s(line)
        if tpot is not None:
            out.append(tpot)
    return out


def prefill_timings(
    lines: Sequence[Mapping[str, Any]],
    groups: Sequence[tuple[ServedAdapter, int]],
    output_tokens: int,
) -> list[PrefillTiming]:
    """Per (adapter, prompt length) of ``groups``: the first steps of the logged requests of that
    adapter and prompt, leased from a GPU slot, that generated ``output_tokens`` tokens (the lone
    warm requests' shape); a group without such a line gives none."""
    found: dict[tuple[str, str, int], list[float]] = {}
    for line in lines:
        seconds = first_step_s(line)
        if seconds is None or line.get("tier") != "L0":
            continue
        if line.get("output_tokens") != output_tokens:
            continue
        key = (str(line.get("tenant")), str(line.get("adapter")), int(line["prompt_tokens"]))
        found.setdefault(key, []).append(seconds)
    out = []
    for adapter, length in groups:
        steps = found.get((adapter.tenant, f"{adapter.name}@{adapter.revision}", length))
        if steps:
            out.append(PrefillTiming(adapter, length, tuple(steps)))
    return out


def wait_for_lines(
    path: Path, offset: int, expected: int, output_tokens: int
) -> list[dict[str, Any]]:
    """The log's lines from ``offset`` once ``expected`` lone-shaped lines are there (a request's
    line is written as it finishes, maybe after its client saw the end), or after
    ``LOG_WAIT_S``: a late line is one request fewer in its median."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        lines = log_lines(path, offset)
        lone = sum(1 for x in lines if x.get("output_tokens") == output_tokens)
        if lone >= expected or time.monotonic() >= deadline:
            return lines
        time.sleep(0.05)


def timed_samples(
    timings: Sequence[PrefillTiming], weights: Mapping[ServedAdapter, tuple[int, float]]
) -> list[StepSample]:
    """One step sample per timing: its prompt tokens on its adapter alone (one revision), its
    median first step; ``weights``: each adapter's (bytes, bytes per rank), (0, 0.0) unknown."""
    samples = []
    for t in timings:
        nbytes, width = weights[t.adapter]
        n = t.prompt_tokens
        samples.append(
            StepSample(0, n, 1, n * t.adapter.rank, t.median_s, False, n * nbytes, width)
        )
    return samples
