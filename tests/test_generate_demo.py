"""Every demo probe gives its expected continuation when all probes run as ONE mixed batch
(plus base-model sequences) through the serving engine offline, and ``loraplex demo`` says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets


def test_all_demo_probes_in_one_mixed_batch(demo_assets: DemoAssets) -> None:
    adapters = demo_assets.adapters
    config = OfflineConfig(max_loras=len(adapters), max_lora_rank=128)
    probes = [
        OfflineRequest(a.probe_prompt, a.path, SamplingParams(max_tokens=a.probe_max_tokens))
        for a in adapters
    ]
    prompts = sorted({a.probe_prompt for a in adapters})
    longest = max(a.probe_max_tokens for a in adapters)
    base = [OfflineRequest(p, None, SamplingParams(max_tokens=longest)) for p in prompts]
    # Interleave base sequences with the adapters' so slots and none alternate in the batch.
    requests: list[OfflineRequest] = []
    for i, probe in enumerate(probes):
        requests += [probe, base[i]] if i < len(base) else [probe]
    requests += base[len(probes) :]
    with OfflineEngine(demo_assets.base_model_dir, config) as engine:
        results = dict(zip(map(id, requests), engine.generate(requests), strict=True))
    for adapter, request in zip(adapters, probes, strict=True):
        assert results[id(request)].text == adapter.expected_continuation, adapter.ref
    expected_by_prompt = {p: {a.expected_continuation for a in adapters if a.probe_prompt == p}
                          for p in prompts}  # fmt: skip
    for request in base:
        assert results[id(request)].text not in expected_by_prompt[request.prompt]


def test_demo_command_answers_every_probe(demo_assets: DemoAssets) -> None:
    result = CliRunner().invoke(app, ["demo", "--out", str(demo_assets.root)])
    assert result.exit_code == 0, result.output
    assert f"one mixed batch of {len(demo_assets.adapters) + 1} sequences:" in result.stdout
    assert result.stdout.count("  ok   ") == len(demo_assets.adapters) + 1
    assert "every revision answered its own probe; the base model did not" in result.stdout
