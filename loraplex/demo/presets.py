"""What each demo preset generates: model sizes, training budgets and the adapter catalogue.

The adapter catalogue is chosen to exercise the adapter lifecycle, not to be useful: ranks from
4 to 64 (128 in ``large``), ``lora_alpha != r`` everywhere, rsLoRA, per-module rank/alpha
patterns, layer subsets, attention-only / attention+MLP / sparse target sets, several tenants
and several revisions of one logical adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.artifacts.base_model import ATTENTION_MODULES, MLP_MODULES, TARGET_MODULES
from loraplex.artifacts.identity import check_name


@dataclass(frozen=True)
class AdapterPlan:
    """One adapter revision to fine-tune: identity and PEFT LoraConfig fields."""

    tenant: str  # owning tenant
    name: str  # logical adapter name within the tenant
    revision: str  # revision label, e.g. "r2"
    rank: int  # LoraConfig.r
    lora_alpha: int  # LoraConfig.lora_alpha (never equal to rank, so scaling != 1 is exercised)
    target_modules: tuple[str, ...]  # LoraConfig.target_modules, module names
    use_rslora: bool = False  # LoraConfig.use_rslora (scale alpha/sqrt(r))
    rank_pattern: tuple[tuple[str, int], ...] = ()  # LoraConfig.rank_pattern items
    alpha_pattern: tuple[tuple[str, int], ...] = ()  # LoraConfig.alpha_pattern items
    layers_to_transform: tuple[int, ...] = ()  # LoraConfig.layers_to_transform; () means all

    def __post_init__(self) -> None:
        check_name("tenant", self.tenant)
        check_name("name", self.name)
        check_name("revision", self.revision)
        if self.rank < 1:
            raise ValueError(f"rank {self.rank} is invalid; expected >= 1")
        if self.lora_alpha == self.rank:
            raise ValueError(f"lora_alpha {self.lora_alpha} is invalid; expected != rank")
        unknown = set(self.target_modules) - set(TARGET_MODULES)
        if not self.target_modules or unknown:
            raise ValueError(
                f"target_modules {self.target_modules} is invalid; expected a non-empty subset "
                f"of {TARGET_MODULES}"
            )

    @property
    def ref(self) -> str:
        """``tenant/name@revision``."""
        return f"{self.tenant}/{self.name}@{self.revision}"


@dataclass(frozen=True)
class DemoPreset:
    """Sizes and training budgets of one preset (``small`` for tests, ``large`` for benchmarks)."""

    name: str  # preset name; the base model directory is loraplex-demo-<name>
    hidden_size: int  # model width
    intermediate_size: int  # SwiGLU width
    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (< num_heads: grouped-query attention)
    max_vocab_size: int  # BPE vocabulary cap (the grammar may need fewer)
    max_position_embeddings: int  # context length written to config.json
    base_steps: int  # optimiser steps for the base model
    base_batch_size: int  # sequences per base step
    base_seq_tokens: int  # tokens per base training sequence
    base_lr: float  # AdamW learning rate for the base model
    adapter_steps_per_round: int  # fine-tune steps between greedy checks
    adapter_max_rounds: int  # rounds before giving up on an adapter (generation fails)
    adapter_lr: float  # AdamW learning rate for LoRA weights up to lr_reference_rank wide
    num_threads: int  # torch intra-op threads while generating (fixed for reproducible bytes)
    adapters: tuple[AdapterPlan, ...]  # every adapter revision to generate
    # Wider adapters train at adapter_lr * sqrt(lr_reference_rank / width) (adapter_lr_for);
    # None: one rate for all.
    lr_reference_rank: int | None = None

    def __post_init__(self) -> None:
        if self.num_kv_heads >= self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads {self.num_kv_heads} is invalid; expected a proper divisor of "
                f"num_heads {self.num_heads} (grouped-query attention)"
            )
        refs = [plan.ref for plan in self.adapters]
        if len(set(refs)) != len(refs):
            raise ValueError(f"adapters {refs} is invalid; expected unique tenant/name@revision")

    def adapter_lr_for(self, plan: AdapterPlan) -> float:
        """The AdamW rate ``plan`` trains at. AdamW moves every LoRA weight by about the rate per
        step, so the delta ``scale * B @ A`` moves about ``scale * r`` times as far: a rate slow
        enough for rank 4 makes rank 128, or a large rsLoRA scale, overshoot. The width compared
        with ``lr_reference_rank`` is ``r * max(1, scale / 2)``: the rank itself for the
        catalogue's usual ``lora_alpha = 2 r``, more for a larger scale."""
        reference = self.lr_reference_rank
        scale = plan.lora_alpha / (plan.rank**0.5 if plan.use_rslora else plan.rank)
        width = plan.rank * max(1.0, scale / 2)
        if reference is None or width <= reference:
            return self.adapter_lr
        return self.adapter_lr * float((reference / width) ** 0.5)

    @property
    def model_name(self) -> str:
        """Directory name of the base model, also adapters' base_model_name_or_path."""
        return f"loraplex-demo-{self.name}"


_ATTN = ATTENTION_MODULES
_ALL = TARGET_MODULES
_SPARSE = ("v_proj", "down_proj")

_CATALOGUE = (
    AdapterPlan("acme", "support", "r1", 8, 16, _ATTN),
    AdapterPlan("acme", "support", "r2", 8, 16, _ATTN),
    AdapterPlan("acme", "billing", "r1", 16, 32, _ALL),
    AdapterPlan("acme", "legal", "r1", 4, 8, _SPARSE),
    AdapterPlan("acme", "triage", "r1", 32, 16, ("q_proj", "v_proj"), use_rslora=True),
    AdapterPlan("globex", "search", "r1", 16, 8, _ALL),
    AdapterPlan("globex", "search", "r2", 16, 8, _ALL),
    AdapterPlan("globex", "search", "r3", 32, 8, _ALL),
    AdapterPlan("globex", "summarize", "r1", 64, 128, _ALL),
    AdapterPlan(
        "globex",
        "translate",
        "r1",
        8,
        16,
        _ATTN,
        rank_pattern=(("q_proj", 16), ("model.layers.0.self_attn.v_proj", 4)),
        alpha_pattern=(("q_proj", 8),),
    ),
    AdapterPlan("globex", "codegen", "r1", 16, 32, _ALL, layers_to_transform=(1, 2)),
    AdapterPlan("initech", "chat", "r1", 8, 32, _ATTN, use_rslora=True),
    AdapterPlan("initech", "classify", "r1", 4, 16, _ATTN),
    AdapterPlan("initech", "extract", "r1", 32, 64, MLP_MODULES),
    AdapterPlan("initech", "review", "r1", 64, 32, _SPARSE),
    AdapterPlan("initech", "review", "r2", 64, 32, _SPARSE),
)

SMALL = DemoPreset(
    name="small",
    hidden_size=256,
    intermediate_size=688,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    max_vocab_size=4096,
    max_position_embeddings=512,
    base_steps=100,
    base_batch_size=16,
    base_seq_tokens=48,
    base_lr=5e-3,
    adapter_steps_per_round=5,
    adapter_max_rounds=40,
    adapter_lr=3e-3,
    num_threads=1,
    adapters=_CATALOGUE,
)

LARGE = DemoPreset(
    name="large",
    hidden_size=1024,
    intermediate_size=2816,
    num_layers=16,
    num_heads=16,
    num_kv_heads=4,
    max_vocab_size=4096,
    max_position_embeddings=2048,
    base_steps=60,
    base_batch_size=8,
    base_seq_tokens=48,
    base_lr=2e-3,
    adapter_steps_per_round=5,
    adapter_max_rounds=80,
    adapter_lr=1.5e-3,
    num_threads=2,
    adapters=(
        *_CATALOGUE,
        AdapterPlan("initech", "longform", "r1", 128, 256, _ALL),
    ),
    lr_reference_rank=16,
)

PRESETS: dict[str, DemoPreset] = {preset.name: preset for preset in (SMALL, LARGE)}


def get_preset(name: str) -> DemoPreset:
    """The preset called ``name``; ValueError naming the choices otherwise."""
    if name not in PRESETS:
        raise ValueError(f"preset {name!r} is invalid; expected one of {sorted(PRESETS)}")
    return PRESETS[name]
