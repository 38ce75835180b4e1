"""paired_rounds: samples sized by duration, ABBA rounds, ratios paired round by round."""

from __future__ import annotations

import pytest

import loraplex.bench.execution.timing as timing
from loraplex.bench.execution.timing import paired_rounds


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_samples_are_sized_by_duration_and_ratios_paired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    order: list[str] = []
    cost = {"slow": 2.0**-7, "fast": 2.0**-10}  # exact in binary

    def call(name: str) -> None:
        order.append(name)
        clock.now += cost[name]

    timed = paired_rounds(
        {"slow": lambda: call("slow"), "fast": lambda: call("fast")},
        rounds=4,
        min_sample_s=2.0**-6,
        warmup_calls=1,
    )
    assert timed.calls == {"slow": 2, "fast": 16}  # each sample lasts >= 2**-6 s
    assert order.count("slow") == 2 + 4 * 2 and order.count("fast") == 2 + 4 * 16
    assert timed.medians() == pytest.approx(cost)
    ratio = timed.ratio("fast", "slow")  # throughput fast / slow, per round
    assert ratio["rounds"] == 4
    assert ratio["median"] == ratio["min"] == ratio["max"] == pytest.approx(8.0)
    assert order[:4] == ["slow", "fast", "slow", "fast"]  # all warm, then each sized
    timed_order = order[4:]  # ABBA by sample
    assert timed_order[:2] == ["slow", "slow"] and timed_order[2:18] == ["fast"] * 16
    assert timed_order[18:34] == ["fast"] * 16 and timed_order[34:36] == ["slow", "slow"]


def test_a_spike_moves_only_its_own_round(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls = {"n": 0}

    def b() -> None:
        calls["n"] += 1
        # calls 1-2 warm and size b; call 4 is b's sample in round 1: one slow call
        clock.now += 2.0**-1 if calls["n"] == 4 else 2.0**-7

    timed = paired_rounds(
        {"a": lambda: setattr(clock, "now", clock.now + 2.0**-7), "b": b},
        rounds=5,
        min_sample_s=2.0**-7,
        warmup_calls=1,
    )
    assert timed.calls == {"a": 1, "b": 1}
    ratio = timed.ratio("a", "b")
    assert ratio["median"] == pytest.approx(1.0) and ratio["max"] == pytest.approx(64.0)
    assert ratio["min"] == pytest.approx(1.0)


def test_bad_arguments_are_refused() -> None:
    for kwargs in (
        {"rounds": 0, "min_sample_s": 0.1},
        {"rounds": 1, "min_sample_s": 0.0},
        {"rounds": 1, "min_sample_s": float("nan")},
        {"rounds": 1, "min_sample_s": 0.1, "warmup_calls": 0},
    ):
        with pytest.raises(ValueError, match="invalid"):
            paired_rounds({}, **kwargs)  # type: ignore[arg-type]


def test_blocks_interleave_abba_and_are_sized_by_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    order: list[str] = []
    cost = {"slow": 2.0**-7, "fast": 2.0**-9}

    def call(name: str) -> None:
        order.append(name)
        clock.now += cost[name]

    timed = paired_rounds(
        {"slow": lambda: call("slow"), "fast": lambda: call("fast")},
        rounds=2,
        min_sample_s=3 * 2.0**-6,
        blocks=3,
        warmup_calls=1,
    )
    assert timed.calls == {"slow": 2, "fast": 8}  # per block: >= 2**-6 s (a third of a sample)
    assert [len(b) for b in timed.blocks["slow"]] == [3, 3]  # 2 rounds of 3 blocks
    runs: list[tuple[str, int]] = []  # the timed calls as (variant, consecutive calls)
    for name in order[4:]:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + 1)
        else:
            runs.append((name, 1))
    # block by block, the order flipping with every block, across rounds too: [s f] [f s] [s f]
    # [f s] [s f] [f s], so a variant's consecutive calls run 2, 16, 2+2, 16+16, ...
    assert [name for name, _ in runs] == ["slow", "fast", "slow", "fast", "slow", "fast", "slow"]
    assert [n for _, n in runs] == [2, 16, 4, 16, 4, 16, 2]
    assert timed.medians() == pytest.approx(cost)
    ratio = timed.ratio("fast", "slow")
    assert ratio["median"] == ratio["min"] == ratio["max"] == pytest.approx(4.0)


def test_a_spike_in_one_block_moves_no_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)

    def run(blocks: int) -> dict[str, float | int]:
        calls = {"n": 0}

        def b() -> None:
            calls["n"] += 1
            # calls 1-2 warm and size b; call 4 is in b's second timed block (first round)
            clock.now += 2.0**-3 if calls["n"] == 4 else 2.0**-7

        timed = paired_rounds(
            {"a": lambda: setattr(clock, "now", clock.now + 2.0**-7), "b": b},
            rounds=3,
            min_sample_s=blocks * 2.0**-7,
            blocks=blocks,
            warmup_calls=1,
        )
        assert timed.calls == {"a": 1, "b": 1}
        return timed.ratio("a", "b")

    blocked = run(3)  # the spike is one block of three: the round's median block is clean
    assert blocked["median"] == blocked["min"] == blocked["max"] == pytest.approx(1.0)
    one = run(1)  # one block per sample: the spike is the round's sample (blocks=1 as before)
    assert one["max"] == pytest.approx(16.0) and one["median"] == pytest.approx(1.0)


def test_bad_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="blocks 0"):
        paired_rounds({}, rounds=1, min_sample_s=0.1, blocks=0)


def test_settle_calls_start_every_block_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    state = {"last": ""}

    def call(name: str) -> None:
        # a call after another variant's is slow (a cold cache); after its own, steady
        clock.now += 2.0**-7 * (4 if state["last"] != name else 1)
        state["last"] = name

    def run(settle: int) -> dict[str, float]:
        state["last"] = ""
        timed = paired_rounds(
            {"a": lambda: call("a"), "b": lambda: call("b")},
            rounds=2,
            min_sample_s=2 * 2.0**-6,
            blocks=2,
            settle_calls=settle,
            warmup_calls=1,
        )
        return timed.medians()

    assert run(1) == {"a": pytest.approx(2.0**-7), "b": pytest.approx(2.0**-7)}
    unsettled = run(0)  # each block's first call pays for its predecessor
    assert unsettled["a"] > 2.0**-7 and unsettled["b"] > 2.0**-7
    with pytest.raises(ValueError, match="settle_calls -1"):
        paired_rounds({}, rounds=1, min_sample_s=0.1, settle_calls=-1)
