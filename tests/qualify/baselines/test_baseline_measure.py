"""One real quick measurement of both comparators: the PEFT merge, real ``loraplex serve``
subprocesses on the merged model and on the base model, a load sweep each, the cold start, and
the run cache that keeps a second cell of the same shape from starting a server again, and the
server pool that lets a later cell with new probes reuse the in-context server of its
configuration.

Slow by nature (three model loads: the merge, two servers): about a minute on a loaded 2-core
machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from loraplex.demo.assets import DemoAssets
from loraplex.qualify.baselines import (
    BaselineContext,
    CellTraffic,
    Probe,
    measure_in_context,
    measure_separate,
)
from loraplex.qualify.baselines.dense import dense_name
from loraplex.qualify.baselines.server import ServerPool
from loraplex.qualify.cost import TOKEN_SHAPES, MachinePrice, TokenShape

REFS = ("acme/support@r1", "acme/billing@r1", "acme/legal@r1")


@pytest.fixture(scope="module")
def ctx(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BaselineContext]:
    price = MachinePrice("this-machine", 0.2, "test figure")
    workdir = tmp_path_factory.mktemp("baselines")
    pool = ServerPool()  # the in-context base-model server, kept across cells as a run keeps it
    try:
        yield BaselineContext(
            demo_assets.root, demo_assets.preset, price, workdir, quick=True, servers=pool
        )
    finally:
        pool.close()


@pytest.fixture(scope="module")
def traffic(demo_assets: DemoAssets) -> CellTraffic:
    adapters = [a for a in demo_assets.adapters if a.ref in REFS]
    probes = [Probe(a.ref, a.probe_prompt, a.expected_continuation) for a in adapters]
    demand = dict.fromkeys(REFS, 0.1)
    # Objectives loose enough for a loaded shared machine: latency is not what is tested here.
    return CellTraffic("quick-short", TOKEN_SHAPES["short"], 30, 100.0, demand, 30.0, 5.0, probes)


def servers(ctx: BaselineContext) -> list[Path]:
    return sorted((ctx.workdir / "servers").iterdir())


def test_separate_measures_a_dedicated_merged_server(
    ctx: BaselineContext, traffic: CellTraffic
) -> None:
    result = measure_separate(ctx, traffic)
    terms = result.terms
    # The merged support model answers its own probe (the base model does not: the in-context
    # test below finds quality below 1 on these probes); quick mode judges one adapter.
    assert result.pass_ratios["quality"] == 1.0
    assert (terms["quality_probes_judged"], terms["quality_probes_not_judged"]) == (1, 2)
    assert result.pass_ratios["correct_revision"] == result.pass_ratios["isolation"] == 1.0
    assert result.pass_ratios["latency"] == 1.0
    capacity = terms["capacity_rps"]
    assert isinstance(capacity, float) and capacity > 0
    assert terms["replicas"] == 3 and terms["deployments"] == 3
    rss = terms["replica_peak_rss_bytes"]
    assert isinstance(rss, int) and rss > 50 << 20  # a Python server with torch loaded
    cold = terms["cold_start_s"]
    assert isinstance(cold, float) and cold > 1.0  # a process start and a full model load
    assert result.machines == 1.0
    assert result.cost_per_correct_request is not None
    merged = ctx.workdir / "merged-models" / dense_name("acme/support@r1")
    record = json.loads((merged / "merged-from.json").read_text())
    assert record["method"] == "peft merge_and_unload"
    assert len(servers(ctx)) == 1


def test_in_context_measures_the_base_model_with_examples(
    ctx: BaselineContext, traffic: CellTraffic
) -> None:
    before = len(servers(ctx))
    result = measure_in_context(ctx, traffic)
    terms = result.terms
    assert terms["examples_shown_mean"] == 2.0  # the other two probes, k = 4
    extra = terms["extra_prompt_tokens_per_request"]
    assert isinstance(extra, float) and extra > 10  # two sentences of examples
    assert terms["swept_prompt_tokens"] == 32 + 16 * -(-int(extra) // 16)
    quality = result.pass_ratios["quality"]
    assert quality is not None and quality < 1.0
    assert result.pass_ratios["correct_revision"] is None
    assert result.pass_ratios["latency"] == 1.0
    assert result.machines == 1.0
    assert len(servers(ctx)) == before + 1
    assert ctx.servers is not None and ctx.servers.started == 1


def test_a_second_cell_of_the_same_shape_reuses_the_measurements(
    ctx: BaselineContext, traffic: CellTraffic
) -> None:
    before = len(servers(ctx))
    heavier = CellTraffic(
        "quick-short-2",
        traffic.shape,
        traffic.requests,
        traffic.wall_s,
        dict.fromkeys(REFS, 1000.0),
        traffic.ttft_slo_s,
        traffic.tpot_slo_s,
        traffic.probes,
    )
    first = measure_separate(ctx, traffic)
    again = measure_separate(ctx, heavier)
    assert again.terms["capacity_rps"] == first.terms["capacity_rps"]
    replicas = again.terms["replicas"]
    assert isinstance(replicas, int) and replicas > 3  # 1,000 rps each is past one replica
    measure_in_context(ctx, heavier)
    assert len(servers(ctx)) == before


def test_a_later_cell_of_the_same_configuration_reuses_the_pooled_server(
    ctx: BaselineContext, traffic: CellTraffic
) -> None:
    assert ctx.servers is not None and ctx.servers.started == 1
    fewer = replace(traffic, cell_id="quick-short-3", probes=traffic.probes[:2])  # not cached
    result = measure_in_context(ctx, fewer)
    assert result.terms["quality_probes_judged"] == 2
    assert ctx.servers.started == 1


def test_examples_past_the_models_context_are_not_served_rather_than_slow(
    ctx: BaselineContext, traffic: CellTraffic
) -> None:
    # qualify's long-prompt cell on the small demo model: 495 prompt tokens (cut to fit 512 with
    # 16 output) plus the examples. Its sweep ran, every request a 400, and was reported as
    # latency 0.0 on 0 machines, as if the in-context deployment were too slow.
    short = measure_in_context(ctx, traffic)
    long_prompt = replace(traffic, cell_id="quick-long", shape=TokenShape("long-prompt", 495, 16))
    result = measure_in_context(ctx, long_prompt)
    assert result.pass_ratios["latency"] is None and result.cost_per_correct_request is None
    assert result.pass_ratios["quality"] == short.pass_ratios["quality"]  # the probes still judged
    assert result.machines == 0.0
    swept = result.terms["swept_prompt_tokens"]
    assert isinstance(swept, int) and swept > 495
    reason = result.terms["not_served"]
    assert isinstance(reason, str) and "exceed the model's context of 512" in reason
    assert f"{swept} prompt tokens (the cell's 495" in reason
    assert ctx.servers is not None and ctx.servers.started == 1  # nothing more was started
