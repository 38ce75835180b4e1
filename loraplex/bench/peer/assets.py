"""What ``loraplex bench peer`` serves: a demo preset's base model and 16 adapters of one mix,
as PEFT directories both servers load.

Two mixes. ``s2``: the preset's own trained demo revisions (the first 16 of its catalogue:
ranks 4 to 64 on varied modules), each with its probe and expected continuation, so both
servers' answers can be checked. ``r16``: 16 distinct random rank-16 adapters on q/k/v/o (the
execution benchmark's ``mixed_r16``, written by the same ``write_random_adapter``, seed
``seed * 1000 + i``): one rank on the attention projections, as many deployments serve. A
random adapter has no expected text, so its probe (a demo probe prompt) is answered but not
checked; the greedy comparison between the two servers covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loraplex.demo.manifest import DemoAssets

NUM_ADAPTERS = 16  # adapters of every mix (the batches and the trace spread over them)
MIXES = ("s2", "r16")
PRESET_MIX = {"small": "s2", "large": "r16"}  # each preset's default mix
R16_RANK = 16
R16_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
R16_TENANT = "bench"
R16_PROBE_MAX_TOKENS = 16  # a random adapter's probe is answered, not checked
# vLLM accepts these --max-lora-rank values only (vllm/config/lora.py, MaxLoRARanks, 0.32)
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class PeerAdapter:
    """One adapter both servers serve."""

    tenant: str  # owning tenant (loraplex: whose key calls it)
    name: str  # adapter name within the tenant
    revision: str  # revision label
    path: Path  # PEFT adapter directory (adapter_config.json + adapter_model.safetensors)
    rank: int  # its largest LoRA rank
    probe_prompt: str  # the prompt of its probe
    probe_max_tokens: int  # max_tokens of its probe
    expected_continuation: str | None  # its probe's expected answer; None: not checked


@dataclass(frozen=True)
class PeerAssets:
    """The base model and the adapters of one comparison."""

    preset: str  # demo preset of the base model ("small" or "large")
    mix: str  # adapter mix, a MIXES entry
    base_model_dir: Path  # Hugging Face checkpoint directory both servers load
    base_model_name: str  # its directory name: the base model's name on both servers
    adapters: tuple[PeerAdapter, ...]  # in route order
    demo: DemoAssets  # the demo set the base model comes from (s2: registered as a whole)

    @property
    def max_lora_rank(self) -> int:
        """The smallest rank vLLM accepts as --max-lora-rank that fits every adapter."""
        widest = max(a.rank for a in self.adapters)
        return next(r for r in VLLM_MAX_LORA_RANKS if r >= widest)


def check_mix(preset: str, mix: str | None) -> str:
    """The mix to use (``mix``, or the preset's default); ValueError naming a bad one."""
    if preset not in PRESET_MIX:
        raise ValueError(f"preset {preset!r} is invalid; expected one of {sorted(PRESET_MIX)}")
    if mix is not None and mix not in MIXES:
        raise ValueError(f"adapter_mix {mix!r} is invalid; expected one of {list(MIXES)}")
    return PRESET_MIX[preset] if mix is None else mix


def demo_adapters(demo: DemoAssets) -> tuple[PeerAdapter, ...]:
    """The first 16 demo revisions with their probes (``large`` has a 17th, rank 128)."""
    if len(demo.adapters) < NUM_ADAPTERS:
        raise ValueError(
            f"demo {demo.root} has {len(demo.adapters)} adapters; expected >= {NUM_ADAPTERS}"
        )
    return tuple(
        PeerAdapter(
            a.tenant,
            a.name,
            a.revision,
            a.path,
            a.rank,
            a.probe_prompt,
            a.probe_max_tokens,
            a.expected_continuation,
        )
        for a in demo.adapters[:NUM_ADAPTERS]
    )


def r16_adapters(demo: DemoAssets, out: Path, seed: int) -> tuple[PeerAdapter, ...]:
    """16 random rank-16 q/k/v/o adapters of ``demo``'s base model, written under ``out``."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.adapters import write_random_adapter

    spec = BaseModelSpec.from_dir(demo.base_model_dir)
    prompts = r16_probe_prompts(demo.preset)
    adapters = []
    for i in range(NUM_ADAPTERS):
        path = write_random_adapter(
            spec,
            demo.base_model_dir,
            out / f"a{i:02d}",
            rank=R16_RANK,
            target_modules=R16_TARGETS,
            seed=seed * 1000 + i,
        )
        adapters.append(
            PeerAdapter(
                R16_TENANT,
                f"r16-{i:02d}",
                "r1",
                path,
                R16_RANK,
                prompts[i % len(prompts)],
                R16_PROBE_MAX_TOKENS,
                None,
            )
        )
    return tuple(adapters)


def r16_probe_prompts(preset: str) -> tuple[str, ...]:
    """The demo catalogue's probe prompts (``The <tenant> <name> team``, as the demo generator
    writes them), one per logical adapter: they need no trained adapter, so a base-only demo
    set has them too."""
    from loraplex.demo.presets import get_preset

    plans = get_preset(preset).adapters
    return tuple(dict.fromkeys(f"The {p.tenant} {p.name} team" for p in plans))


def peer_assets(demo: DemoAssets, mix: str, scratch: Path, seed: int) -> PeerAssets:
    """``demo``'s base model with the ``mix`` adapters (r16 ones written under ``scratch``)."""
    if mix not in MIXES:
        raise ValueError(f"adapter_mix {mix!r} is invalid; expected one of {list(MIXES)}")
    adapters = demo_adapters(demo) if mix == "s2" else r16_adapters(demo, scratch, seed)
    return PeerAssets(demo.preset, mix, demo.base_model_dir, demo.base_model_name, adapters, demo)


def load_preset(asset_dir: Path, preset: str, mix: str) -> DemoAssets:
    """The demo set ``mix`` needs. ``s2``: the whole set of ``preset`` under
    ``asset_dir/test-<preset>``, generated once if missing (the large one trains 17 adapters:
    tens of minutes, see docs/benchmarks/demo-assets.md). ``r16`` writes its own adapters and
    needs only the base model: the whole set's when it is there, else the base-only set under
    ``asset_dir/test-<preset>-base`` (the same base model bytes; minutes on large)."""
    from loraplex.demo.assets import demo_assets_ready, generate_demo_assets

    whole = asset_dir / f"test-{preset}"
    if mix == "s2" or demo_assets_ready(whole.resolve(), preset, 0):
        return generate_demo_assets(whole, preset=preset, seed=0)
    return generate_demo_assets(asset_dir / f"test-{preset}-base", preset, 0, adapters=False)
