"""A KV space smaller than one ``max_model_len`` sequence is refused, as ``loraplex serve``
refuses it (engine/config.py): before, a request longer than the KV space waited for blocks that
never free and the simulation never ended."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sim_inputs import COST_FILE, cost
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.sim.config import SimConfig
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

# 20 prompt + 40 output tokens: 4 blocks of 16, where the refused config has 2
_LONG = [TraceRecord(0.0, "t", "a", 20, 40)]


def _within(seconds: float, call: Callable[[], object]) -> object:
    """``call``'s result or raised error, failing the test if it takes over ``seconds`` (it
    keeps running in a daemon thread: the hang this file guards against)."""
    done: list[object] = []

    def target() -> None:
        try:
            done.append(call())
        except Exception as e:  # handed back to the test
            done.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert done, f"still running after {seconds} s"
    return done[0]


def test_a_kv_space_smaller_than_one_sequence_is_refused_not_simulated_forever() -> None:
    config = lambda: SimConfig(num_kv_blocks=2, block_size=16, max_model_len=512)  # noqa: E731
    outcome = _within(30.0, lambda: simulate(_LONG, config(), cost()))
    assert isinstance(outcome, ValueError)
    assert str(outcome) == (
        "num_kv_blocks 2 x block_size 16 is invalid; expected room for one max_model_len 512 "
        "sequence"
    )


def test_exactly_one_sequence_of_kv_runs_a_request_that_fills_the_context() -> None:
    """At the limit the rule allows, a request of ``max_model_len`` tokens (20 prompt + 12
    output) runs to its end; the request the refused config hung on (20 + 40) is refused at
    arrival, as the server answers it (a 400 ``context_length_exceeded``; before 2026-12-07 it
    ran and ended at 32 tokens)."""
    config = SimConfig(num_kv_blocks=2, block_size=16, max_model_len=32)
    refused = _within(30.0, lambda: simulate(_LONG, config, cost()).metrics)
    assert isinstance(refused, dict)
    assert refused["refused"] == {"context_length_exceeded": 1} and refused["completed"] == 0
    full = [TraceRecord(0.0, "t", "a", 20, 12)]
    metrics = _within(30.0, lambda: simulate(full, config, cost()).metrics)
    assert isinstance(metrics, dict)
    assert metrics["completed"] == 1 and metrics["errors"] == {}
    tokens = metrics["throughput_tokens_per_s"] * metrics["makespan_s"]
    assert tokens == pytest.approx(12, abs=0.01)
    assert metrics["engine_steps"] == 12  # one token a step


def test_sim_run_names_both_flags() -> None:
    args = ["sim", "run", "--workload", "uniform", "--cost-model", str(COST_FILE)]
    result = CliRunner().invoke(app, [*args, "--num-kv-blocks", "8", "--max-model-len", "512"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --num-kv-blocks/--max-model-len: num_kv_blocks 8 x")


@pytest.mark.parametrize(("blocks", "length"), [(32, 512), (1024, 16384)])
def test_the_rule_is_the_servers(blocks: int, length: int) -> None:
    """Room for exactly one sequence passes both; one token more is refused by both."""
    from loraplex.engine.config import EngineConfig, SchedulerConfig

    EngineConfig(scheduler=SchedulerConfig(max_model_len=length), num_kv_blocks=blocks)
    SimConfig(num_kv_blocks=blocks, max_model_len=length)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        EngineConfig(scheduler=SchedulerConfig(max_model_len=length + 1), num_kv_blocks=blocks)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        SimConfig(num_kv_blocks=blocks, max_model_len=length + 1)
