"""The simulator's speed work changed how fast it runs, not what it computes: every case of
``sim_golden.py`` gives the result (its ``to_json()``, hashed) that the code before that work
gave (commit ba7c122, recorded with ``sim_golden.CASES``).

Recorded again when ``SimConfig`` gained ``step_work_ratio`` (the engine's per-step work share,
``engine/sched/step_share.py``): every result now carries that field; with it 0 (off) the
``hot-classes-shared-cpu`` result was compared field for field with the one recorded at ba7c122
and was the same but for the new field. The hashes below are with the default (1.0).

Recorded again for ``hot-fleet`` and ``scale-8`` (the fleet cases) when the router's rule 4
changed (every replica saturated: the score decides, not the least loaded replica;
docs/router.md): they route differently now (L0 hit ratio 0.4817 -> 0.5138 and 0.488 -> 0.544,
P99 TTFT 63.6 -> 58.3 and 58.0 -> 58.2 ms); the single-replica cases are unchanged.

Recorded again for ``zipf-tight-kv`` when ``SimConfig`` gained ``loraplex serve``'s KV rule
(``num_kv_blocks`` x ``block_size`` >= ``max_model_len``): its 24 x 16 = 384 tokens held no
2048-token sequence, so it now passes ``max_model_len`` 384 (its requests reach 80 tokens). Run
both ways, its metrics were equal and the result differed only in ``config.max_model_len``
(2048 -> 384); the 2048 run still gave the hash recorded before (6e48815b...).

Recorded again for every case when ``default_tenant_tier_share`` became work-conserving (a
tenant borrows free room beyond its share; ``residency/reclaim.py``): these traces are mostly
one or two tenants, held to half the slots before. Main 7ac02dc -> this change, L0 hit ratio
and P99 TTFT: zipf-single 0.0842 -> 0.2053, 248.7 -> 87.2 ms; zipf-tight-kv 0.0788 -> 0.1333,
619.3 -> 149.0 ms; hot-fleet 0.5138 -> 0.5688, 58.3 -> 58.3 ms; cold-scarce 0.0652 -> 0.0696
(completed 164 -> 165); hot-classes-shared-cpu 0.2018 -> 0.2752, 3431.6 -> 3636.5 ms (P50 43.1
-> 41.7 ms); scale-8 0.544 -> 0.539, 58.2 -> 59.5 ms.

Recorded again for every case when the simulated lease desk took the engine's wait for copies
from host memory (``MAX_COPY_WAIT_S``, 20 ms a step for all of them, charged in sequence as the
slot lock runs them; ``sim/lease_desk.py``): such a lease is settled in the step that asked for
it, and that step starts after the copies (or the bound). Main 3c3ef86 -> this change, L0 hit
ratio, TTFT P50 / P99: zipf-single 0.2053 -> 0.2105, 21.8 / 87.2 -> 19.0 / 136.2 ms;
zipf-tight-kv 0.1333 -> 0.1394, 34.9 / 149.0 -> 55.3 / 523.6 ms; hot-fleet 0.5688 -> 0.5688,
13.7 / 58.3 -> 13.6 / 58.3 ms; hot-classes-shared-cpu 0.2752 -> 0.2844, 41.7 / 3636.5 -> 42.0 /
3917.3 ms; scale-8 0.539 -> 0.542, 16.1 / 59.5 -> 15.1 / 59.5 ms; cold-scarce 0.0696 -> 0.0652,
completed 165 -> 113 (P50 461.3 ms -> the 60 s of a failed request): its one load place is
always busy with cold loads, so none of its 91 copy waits came in time and each cost its step
the whole 20 ms, as the engine's wait would.

Recorded again when the engine and the simulator wait only for a copy under way
(``TieredAdapterCache.is_moving``: started, not queued behind the load bounds nor blocked for
room): L0 hit ratio, completed, TTFT P50 / P99 before -> after: cold-scarce 0.0652 -> 0.0696,
113 -> 165, P50 60 s -> 461.3 ms (its figures before the copy wait); zipf-tight-kv 0.1394 ->
0.1273, 55.3 / 523.6 -> 48.5 / 206.2 ms; zipf-single 0.2105 -> 0.2105, 19.0 / 136.2 -> 19.0 /
111.4 ms; hot-classes-shared-cpu 0.2844 -> 0.2844, 42.0 / 3917.3 -> 36.9 / 3770.3 ms;
hot-fleet and scale-8 unchanged.

Recorded again for ``cold-scarce`` and ``hot-classes-shared-cpu`` when the simulated lease desk
asked ``TieredAdapterCache.reclaiming`` as the engine's does (a tenant over its GPU share gets no
new lease on a borrowed copy while another tenant's load under its share waits for that room):
held back a candidate 5 times in cold-scarce (steady-a's ad0000; each step counted) and 77 in
hot-classes-shared-cpu (prio's hot0003 and hot0006); none in the other four, whose results are
unchanged. Main fd8fa5d -> this change, L0 hit ratio, completed, TTFT P50 / P99: cold-scarce
0.0696 -> 0.0522, 165 -> 167, 461.3 ms / 60 s -> 460.7 ms / 60 s (1131 -> 1137 steps);
hot-classes-shared-cpu 0.2844 -> 0.2706, 218 -> 218, 36.9 / 3770.3 -> 43.5 / 3770.3 ms (1239 ->
1240 steps): fewer requests hit a GPU copy (the held-back copies' room went to the waiting
loads).

2026-12-05 (DEDICATE): every result's config gained ``"topology": null`` (``SimConfig.topology``);
with that key taken out of the JSON each case gave the digest recorded before, byte for byte.

Recorded again for ``hot-fleet`` and ``scale-8`` (the fleet cases) when the simulator's replicas
were named by deployment rank (``rank-0``, .., as the fleet's router now places: docs/fleet.md,
"Placement identity") instead of ``replica-000``, ..: another hash of the names, another
partition of the cold revisions. With the old names passed both still gave the digests
recorded before. L0 hit ratio, TTFT P50 / P99 before -> after: hot-fleet 0.5688 -> 0.6009,
13.6 / 58.3 -> 12.8 / 57.0 ms; scale-8 0.542 -> 0.555, 15.1 / 59.5 -> 15.1 / 57.9 ms.

Recorded again for every case when the result's ``cold_loads`` (the acquires that reached the
store) was renamed ``store_loads`` (2026-12-07; docs/simulator.md): with ``store_loads`` named
``cold_loads`` again and the JSON re-serialized (sorted keys) each case gave the digest recorded
before, byte for byte.

Recorded again for every case when the result gained ``refused`` (2026-12-07, simrefuse: requests
the server refuses at arrival, ``sim/refusal.py``; none in these traces, so ``{}``): with that key
taken out of the JSON each case was equal to main 4eaf05f's, whose digests were the ones above.

Recorded again for ``hot-fleet`` and ``scale-8`` (the fleet cases) when the simulated fleet's
router ended each request's decision at its end, as the fleet's engine client has it end there
since attackfleet and attackfleet2 (``Router.finish`` after a first token, ``Router.withdraw``
before one): before, a replica's finished requests stayed its pending load until its next report
here. Main de3f05e8 -> this change, L0 hit ratio, TTFT P50 / P99, ``saturated`` decisions:
hot-fleet 0.6009 -> 0.578, 12.8 / 57.0 -> 14.4 / 131.7 ms, 19 -> 0; scale-8 0.555 -> 0.62, 15.1 /
57.9 -> 15.1 / 56.6 ms, 216 -> 1; the single-replica cases are unchanged."""

from __future__ import annotations

import gc

import pytest
from sim_golden import CASES, digest
from sim_inputs import cost

from loraplex.sim import run
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome, OutcomeLog
from loraplex.sim.run import simulate
from loraplex.sim.scale import synthetic_trace

RECORDED = {
    "zipf-single": "d9c458f9094c54a4fe8757c3c0ee698b0e7e1e5a7e403a2626581ce78b075ee0",
    "hot-fleet": "fd02feff8b2dacbb6a8a8135536f2740af6bd7f51e5ddd7247cb2edb794dab0a",
    "cold-scarce": "d323d87f60f8ed2760a4838a85ffd9b7b4043ff739b0a95781a073320c7e7fb4",
    "hot-classes-shared-cpu": "821b27e4558418db0aff10bdb79d4940034190804e50c2f925ef0b0555d12822",
    "zipf-tight-kv": "29c7c0079a7a25f5136f2504d65d3bbcc237a79f8db36cd3573e34587a7c6632",
    "scale-8": "1d98e48eb2f8bf6ded90f5167c23e630d3680ea2cd1801925efb3126cf83916d",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_result_is_the_one_recorded_before_the_speed_work(name: str) -> None:
    assert digest(CASES[name]()) == RECORDED[name]


def test_steady_decode_steps_in_bulk_give_the_step_by_step_result() -> None:
    """The same trace with every step its own event and with steady decode runs in bulk
    (``sim/decode_run.py``): the same result, byte for byte, the same engine steps."""
    trace = synthetic_trace(400, 60, 20.0 * 3, seed=1)
    config = SimConfig(replicas=3, max_loras=4, auto_warm_interval_s=1.0)
    slow, fast = (simulate(trace, config, cost(), skip_steps=s) for s in (False, True))
    assert fast.to_json() == slow.to_json()
    assert fast.metrics["engine_steps"] == slow.metrics["engine_steps"] > 5 * len(trace)


@pytest.mark.parametrize("name", ["hot-fleet", "scale-8", "cold-scarce"])
def test_sealing_ended_outcomes_changes_no_figure(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run seals ended outcomes into tuples every ``seal_every`` requests (4096: none in these
    small cases): sealed every 3, every case still gives the result recorded before."""
    logs: list[OutcomeLog] = []

    def often() -> OutcomeLog:
        logs.append(OutcomeLog(seal_every=3))
        return logs[-1]

    monkeypatch.setattr(run, "OutcomeLog", often)
    assert digest(CASES[name]()) == RECORDED[name]
    (log,) = logs
    assert log.num_sealed > len(log.outcomes()) // 2


def test_an_outcome_log_gives_back_every_outcome_in_order() -> None:
    log = OutcomeLog(seal_every=2)
    made = [Outcome(float(i), f"t{i}", replica=i, reason=f"r{i}") for i in range(7)]
    for i, outcome in enumerate(made):
        log.add(outcome)
        outcome.tier, outcome.first_token_s, outcome.output_tokens = "L1", i + 0.25, i + 3
        if i % 3 == 0:  # ends once added: sealed by the next seal
            outcome.end_s, outcome.error = i + 0.5, "QueueTimeoutError"
    made[1].end_s = 9.0  # ends late: sealed by the first seal after it ended
    log.add(extra := Outcome(8.0, "t8", replica=2, reason="gpu_hit"))
    # seals at 2, 4, 6 and 8 outcomes: 0 at the first, 3 at the third, 1 and 6 at the fourth
    assert log.num_sealed == 4
    assert log.outcomes() == [*made, extra]
    assert all(type(o) is Outcome for o in log.outcomes())
    with pytest.raises(ValueError, match="seal_every 0"):
        OutcomeLog(seal_every=0)


def test_a_run_collects_its_young_generation_less_often_and_restores_the_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``simulate`` raises the collector's first threshold for the run only (``run._frozen_heap``)
    and puts every threshold back after it, also when the run fails."""
    seen: list[tuple[int, int, int]] = []

    def fails(*args: object, **kwargs: object) -> None:
        seen.append(gc.get_threshold())
        raise RuntimeError("stop")

    before = gc.get_threshold()
    monkeypatch.setattr(run, "_simulate", fails)
    with pytest.raises(RuntimeError, match="stop"):
        simulate([], SimConfig(), cost())
    assert seen == [(max(before[0], run.YOUNG_COLLECTION_EVERY), *before[1:])]
    assert seen[0][0] > 700 and gc.get_threshold() == before
