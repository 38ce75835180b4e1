"""Request-level replay for ``bench modes``: TTFT and throughput of whole requests, unmerged vs
``auto``, on the same work and the same clock.

A closed loop of ``concurrency`` clients: each submits a request (a revision, a prompt, a number
of tokens to generate) and the next one as soon as its previous request finished. Each step is
one forward over every new request's whole prompt (its prefill; the step's last logits give its
first token) and one token of every running request (greedy). Who runs in which step depends
only on step counts, never on the clock, so both modes do exactly the same work and must emit
the same tokens: every unmerged replay exactly, every ``auto`` replay within the parity rule
(bench/modes/parity.py: exact in float32, a near-tie in 16-bit dtypes);
:class:`~loraplex.bench.modes.parity.ProbeMismatchError` otherwise.

``auto`` decides before every step with the production decision code
(:class:`~loraplex.bench.modes.auto_mode.AutoMode`: ``decide`` over a ``TokenWindow`` of the
replay's own tokens on the wall clock, its merged / unmerged step costs and the LoRA op's cost
per token, as ``engine/mode_control.py`` does); transitions and the timing are paid inside the
timed replay. TTFT is from a request's submission to the end of the step that produced its
first token.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace

import torch

from loraplex.bench.modes.auto_mode import AutoMode
from loraplex.bench.modes.parity import ParityReport, ParityRule, StepTop, step_tops
from loraplex.bench.modes.replay_split import StepRecord, time_split
from loraplex.bench.modes.setup import HOT, NUM_ADAPTERS, Setup
from loraplex.engine.mode_policy import MeasuredCosts, ModePolicyConfig
from loraplex.model.kv_cache import ContiguousKVCache, SequenceChunk
from loraplex.model.llama import ForwardBatch, LoraApplier


@dataclass(frozen=True)
class ReplayRequest:
    """One request of a trace."""

    slot: int | None  # adapter slot (None: the base model)
    prompt: tuple[int, ...]  # prompt token ids
    max_tokens: int  # tokens to generate


@dataclass
class ReplayRun:
    """What one replay of a trace measured."""

    seconds: float  # wall time from the first submission to the last token
    tokens: int  # prompt + generated tokens processed
    ttft_s: list[float]  # per request, in trace order
    outputs: list[list[StepTop]]  # generated tokens (with top logprobs) per request, in order
    steps: int  # forwards run
    transitions: int = 0  # merges + unmerges made (auto)
    # auto: the LoRA op's seconds per token it measured (None: fewer timed steps than needed)
    lora_s_per_token: float | None = None
    merged_steps: int = 0  # steps run with a revision merged (auto)
    # per request, in trace order: the step (0-based) whose end gave its first token; step 0 is
    # the opening burst, every client's prompt in one prefill
    first_step: list[int] = field(default_factory=list)
    after_transition: list[int] = field(default_factory=list)  # steps a transition preceded
    step_log: list[StepRecord] = field(default_factory=list)  # per step, in order
    stalls_ms: list[float] = field(default_factory=list)  # auto: each transition's stall
    staging_ms: list[float] = field(default_factory=list)  # auto: each merge's staging work
    staging_steps: list[int] = field(default_factory=list)  # auto: each staging's boundaries


def trace(
    rng: random.Random,
    num: int,
    hot_share: float | None,
    prompt_tokens: int,
    vocab: int,
    *,
    output_tokens: tuple[int, int] = (8, 24),
) -> list[ReplayRequest]:
    """``num`` requests: ``round(hot_share * num)`` on the hot revision and the rest over the 15
    others at random (``hot_share`` None: the 16 revisions in turn), shuffled; output lengths
    drawn from ``output_tokens`` (inclusive) so clients drift apart."""
    if hot_share is None:
        slots: list[int | None] = [i % NUM_ADAPTERS for i in range(num)]
    else:
        num_hot = round(hot_share * num)
        slots = [HOT] * num_hot
        slots += [rng.randrange(1, NUM_ADAPTERS) for _ in range(num - num_hot)]
    rng.shuffle(slots)
    return [
        ReplayRequest(
            slot,
            tuple(rng.randrange(3, vocab) for _ in range(prompt_tokens)),
            rng.randint(*output_tokens),
        )
        for slot in slots
    ]


def hot_token_share(requests: list[ReplayRequest]) -> float:
    """The hot revision's share of the trace's tokens (prompt + generated)."""
    total = sum(len(r.prompt) + r.max_tokens for r in requests)
    hot = sum(len(r.prompt) + r.max_tokens for r in requests if r.slot == HOT)
    return hot / total


@dataclass
class _Live:
    index: int  # position in the trace
    seq: int  # KV row
    submitted_s: float  # when its client submitted it
    cached: int = 0  # tokens in the KV cache
    out: list[StepTop] = field(default_factory=list)  # generated so far


def _forward(
    setup: Setup,
    requests: list[ReplayRequest],
    live: list[_Live],
    kv: ContiguousKVCache,
    applier: LoraApplier,
) -> tuple[list[SequenceChunk], list[StepTop]]:
    """One step: each live request's prompt (new) or last token (running); the greedy picks."""
    ids: list[int] = []
    chunks: list[SequenceChunk] = []
    slots: list[int] = []
    for item in live:
        request = requests[item.index]
        new = list(request.prompt) if not item.out else [item.out[-1].token]
        ids += new
        chunks.append(SequenceChunk(item.seq, item.cached, len(new)))
        slots += [-1 if request.slot is None else request.slot] * len(new)
    logits = setup.model.forward_batch(
        ForwardBatch.build(ids, chunks, token_slots=slots), kv, applier
    )
    return chunks, step_tops(logits)


def _record(
    requests: list[ReplayRequest], live: list[_Live], chunks: list[SequenceChunk], merged: bool
) -> StepRecord:
    """The step's work (its times are filled in by the caller)."""
    tokens = {(False, False): 0, (False, True): 0, (True, False): 0, (True, True): 0}
    for item, chunk in zip(live, chunks, strict=True):  # (a prompt, the hot revision)
        tokens[not item.out, requests[item.index].slot == HOT] += chunk.num_tokens
    prefill = tokens[True, False] + tokens[True, True]
    decode = tokens[False, False] + tokens[False, True]
    return StepRecord(
        0.0, 0.0, 0.0, len(live), prefill, decode, tokens[True, True], tokens[False, True], merged
    )


def replay(
    setup: Setup, requests: list[ReplayRequest], concurrency: int, auto: AutoMode | None
) -> ReplayRun:
    """Runs ``requests`` through ``concurrency`` closed-loop clients, unmerged (``auto`` None)
    or under ``auto``; see the module docstring."""
    model = setup.model
    longest = max(len(r.prompt) + r.max_tokens for r in requests)
    kv = ContiguousKVCache(
        model.attention_shape, concurrency, longest, dtype=model.dtype, device=model.device
    )
    start = time.perf_counter()
    run = ReplayRun(0.0, 0, [0.0] * len(requests), [[] for _ in requests], 0)
    run.first_step = [-1] * len(requests)
    live = [_Live(i, kv.allocate(), start) for i in range(min(concurrency, len(requests)))]
    next_index = len(live)
    with torch.no_grad():
        while live:
            decide_start = time.perf_counter()
            if auto is not None:
                made = auto.transitions
                auto.before_step(decide_start)
                if auto.transitions != made:
                    run.after_transition.append(run.steps)
                run.merged_steps += auto.merged is not None
            step_start = time.perf_counter()
            applier = setup.pool if auto is None else auto.applier
            chunks, picked = _forward(setup, requests, live, kv, applier)
            now = time.perf_counter()
            run.tokens += sum(c.num_tokens for c in chunks)
            run.steps += 1
            if auto is not None:
                slots = [requests[item.index].slot for item in live]
                work = [(slot, c.num_tokens) for slot, c in zip(slots, chunks, strict=True)]
                auto.after_step(now, now - step_start, work)
            record = _record(requests, live, chunks, auto is not None and auto.merged is not None)
            still: list[_Live] = []
            for item, chunk, token in zip(live, chunks, picked, strict=True):
                item.cached += chunk.num_tokens
                if not item.out:
                    run.ttft_s[item.index] = now - item.submitted_s
                    run.first_step[item.index] = run.steps - 1
                item.out.append(token)
                if len(item.out) < requests[item.index].max_tokens:
                    still.append(item)
                    continue
                run.outputs[item.index] = item.out
                kv.free(item.seq)
                if next_index < len(requests):
                    still.append(_Live(next_index, kv.allocate(), now))
                    next_index += 1
            run.step_log.append(
                replace(
                    record,
                    decide_s=step_start - decide_start,
                    forward_s=now - step_start,
                    bookkeeping_s=time.perf_counter() - now,
                )
            )
            live = still
    run.seconds = time.perf_counter() - start
    if auto is not None:
        _note_auto(run, auto)
    return run


def _note_auto(run: ReplayRun, auto: AutoMode) -> None:
    """``run``'s record of what ``auto`` did: transitions, their stalls and staging, and the
    LoRA cost it measured."""
    run.transitions = auto.transitions
    run.stalls_ms, run.staging_ms = auto.stalls_ms, auto.staging_ms
    run.staging_steps = auto.staging_steps
    if auto.lora_cost.measured:
        run.lora_s_per_token = auto.lora_cost.per_token()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def compare_modes(
    setup: Setup,
    requests: list[ReplayRequest],
    concurrency: int,
    costs: MeasuredCosts,
    rounds: int,
    *,
    report: ParityReport,
    policy: ModePolicyConfig | None = None,
) -> dict[str, object]:
    """Unmerged vs ``auto`` replays of ``requests``: a warm-up pair (not counted), then
    ``rounds`` times ABBA (unmerged, auto, auto, unmerged). Every replay is checked against the
    first (unmerged) one: unmerged ones exactly, ``auto`` ones by ``report``'s rule, which
    raises ProbeMismatchError (and keeps the near-ties it accepted)."""
    order = ["unmerged", "auto"] + ["unmerged", "auto", "auto", "unmerged"] * rounds
    runs: dict[str, list[ReplayRun]] = {"unmerged": [], "auto": []}
    want: list[list[StepTop]] | None = None
    exact = ParityRule(exact=True)
    for number, name in enumerate(order):
        auto = AutoMode(setup, costs, policy or ModePolicyConfig()) if name == "auto" else None
        try:
            run = replay(setup, requests, concurrency, auto)
        finally:
            if auto is not None:
                auto.close()
        want = want or run.outputs
        for index, (got, expected) in enumerate(zip(run.outputs, want, strict=True)):
            label = f"replay request {index} (slot {requests[index].slot}) under {name} #{number}"
            report.check(label, expected, got, None if name == "auto" else exact)
        if number >= 2:
            runs[name].append(run)
    return summary(runs["unmerged"], runs["auto"])


def ttft_tail(runs: list[ReplayRun], at_least_s: float) -> dict[str, int]:
    """Where the requests whose TTFT is at least ``at_least_s`` (a mode's P99) got their first
    token: the opening burst (step 0: every client's prompt in one prefill, before ``auto`` can
    have merged), the first step after a transition, or any other step."""
    tail = {"opening_burst": 0, "after_transition": 0, "other": 0}
    for run in runs:
        after = set(run.after_transition)
        for ttft, step in zip(run.ttft_s, run.first_step, strict=True):
            if ttft >= at_least_s:
                key = "after_transition" if step in after else "other"
                tail["opening_burst" if step == 0 else key] += 1
    return tail


def summary(unmerged: list[ReplayRun], auto: list[ReplayRun]) -> dict[str, object]:
    """Tokens/s (all replays' tokens over their seconds) and TTFT P50/P99 (every request of
    every replay) per mode, and auto over unmerged for both (None when undefined). Where the P99
    comes from: the tail's requests by step (:func:`ttft_tail`), the slowest opening burst, and
    the P99 of the requests after it (``after_opening``), with its ratio."""
    out: dict[str, object] = {"replays_per_mode": len(unmerged)}
    figures: dict[str, tuple[float, float]] = {}
    later_p99: dict[str, float | None] = {}
    for name, done in (("unmerged", unmerged), ("auto", auto)):
        ttft = [t for run in done for t in run.ttft_s]
        seconds = sum(r.seconds for r in done)
        tps = sum(r.tokens for r in done) / seconds if seconds else 0.0
        p99 = pct(ttft, 0.99) * 1000
        figures[name] = (tps, p99)
        out[f"{name}_tokens_per_s"] = tps
        out[f"{name}_ttft_ms_p50"] = pct(ttft, 0.5) * 1000
        out[f"{name}_ttft_ms_p99"] = p99
        out[f"{name}_ttft_tail"] = ttft_tail(done, p99 / 1000)
        pairs = [pair for run in done for pair in zip(run.ttft_s, run.first_step, strict=True)]
        opening = [t for t, step in pairs if step == 0]
        later = [t for t, step in pairs if step > 0]
        out[f"{name}_opening_ttft_ms_max"] = max(opening) * 1000 if opening else None
        later_p99[name] = pct(later, 0.99) * 1000 if later else None
        out[f"{name}_ttft_ms_p99_after_opening"] = later_p99[name]
    out["auto_transitions"] = sum(r.transitions for r in auto)
    # what the steps waited per transition (a merge's commit, an unmerge), and a merge's
    # staging work before its commit, spread over ``staging_steps`` boundaries
    for key in ("stalls_ms", "staging_ms", "staging_steps"):
        values: list[float] = [v for r in auto for v in getattr(r, key)]
        out[f"auto_{key}_p50"] = pct(values, 0.5) if values else None
        out[f"auto_{key}_p99"] = pct(values, 0.99) if values else None
    measured = sorted(r.lora_s_per_token for r in auto if r.lora_s_per_token is not None)
    out["auto_lora_s_per_token"] = measured[len(measured) // 2] if measured else None
    steps = sum(r.steps for r in auto)
    out["auto_merged_step_share"] = sum(r.merged_steps for r in auto) / steps if steps else None
    (tps_u, p99_u), (tps_a, p99_a) = figures["unmerged"], figures["auto"]
    out["throughput_auto_over_unmerged"] = tps_a / tps_u if tps_u else None
    out["ttft_p99_auto_over_unmerged"] = p99_a / p99_u if p99_u else None
    later_u, later_a = later_p99["unmerged"], later_p99["auto"]
    out["ttft_p99_after_opening_auto_over_unmerged"] = (
        later_a / later_u if later_a is not None and later_u else None
    )
    out["time_split"] = time_split([r.step_log for r in unmerged], [r.step_log for r in auto])
    return out
