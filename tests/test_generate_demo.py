"""Every demo probe gives its expected continuation when all probes run as ONE mixed batch
(plus base-model sequences) through the offline generation API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loraplex.model.generate import GenerationRequest, GeneratorConfig, OfflineGenerator
from loraplex.sampling import SamplingParams

if TYPE_CHECKING:
    from loraplex.demo.assets import DemoAssets


def test_all_demo_probes_in_one_mixed_batch(demo_assets: DemoAssets) -> None:
    adapters = demo_assets.adapters
    config = GeneratorConfig(max_loras=len(adapters), max_lora_rank=128)
    generator = OfflineGenerator(demo_assets.base_model_dir, config)
    probes = [
        GenerationRequest(a.probe_prompt, a.path, SamplingParams(max_tokens=a.probe_max_tokens))
        for a in adapters
    ]
    prompts = sorted({a.probe_prompt for a in adapters})
    longest = max(a.probe_max_tokens for a in adapters)
    base = [GenerationRequest(p, None, SamplingParams(max_tokens=longest)) for p in prompts]
    # Interleave base sequences with the adapters' so slots and none alternate in the batch.
    requests: list[GenerationRequest] = []
    for i, probe in enumerate(probes):
        requests += [probe, base[i]] if i < len(base) else [probe]
    requests += base[len(probes) :]
    results = dict(zip(map(id, requests), generator.generate(requests), strict=True))
    for adapter, request in zip(adapters, probes, strict=True):
        assert results[id(request)].text == adapter.expected_continuation, adapter.ref
    expected_by_prompt = {p: {a.expected_continuation for a in adapters if a.probe_prompt == p}
                          for p in prompts}  # fmt: skip
    for request in base:
        assert results[id(request)].text not in expected_by_prompt[request.prompt]
