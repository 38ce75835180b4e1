"""The generator pipeline: corpus → tokenizer → base model → adapters → manifest.

Writes into a directory it owns completely (``assets.py`` renames it into place afterwards).
NOTE: imports torch, transformers and peft.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from loraplex.artifacts.base_model import base_model_digest
from loraplex.artifacts.identity import sha256_file
from loraplex.demo import adapters, base, corpus, tokenizer
from loraplex.demo.manifest import MANIFEST_NAME, DemoAdapter, DemoAssets, write_manifest
from loraplex.demo.presets import AdapterPlan, DemoPreset

_NUM_BASE_TEXTS = 4000
_NUM_REGULAR_TEXTS = 200
_NUM_HELDOUT_TEXTS = 16
# Each adapter is also decoded on the probe prompts of this many other logical adapters.
_NUM_CROSS_CHECKS = 3


@dataclass(frozen=True)
class _Context:
    """What every adapter's fine-tune shares."""

    preset: DemoPreset  # sizes and budgets
    seed: int  # generator seed
    model: torch.nn.Module  # trained base model (never modified)
    tokenizer: Tokenizer  # the trained BPE
    regular_texts: tuple[str, ...]  # corpus text mixed into every fine-tune
    heldout_texts: tuple[str, ...]  # corpus text the drift check scores
    heldout_loss: float  # the base model's loss on heldout_texts
    probes: dict[str, adapters.Probe]  # plan.ref -> its probe


def generate(root: Path, preset: DemoPreset, seed: int, *, adapters: bool = True) -> DemoAssets:
    """Generate every asset of ``preset`` into the (new, empty) directory ``root``; with
    ``adapters=False`` only the tokenizer and the base model (the same bytes as in the whole
    set: the adapters are trained after the base model is saved)."""
    model_dir = root / "models" / preset.model_name
    model_dir.mkdir(parents=True)
    texts = base.base_texts(random.Random(seed), _NUM_BASE_TEXTS, preset.adapters)
    bpe = tokenizer.train_tokenizer(texts, preset.max_vocab_size)
    tokenizer.save_tokenizer(bpe, model_dir, preset.max_position_embeddings)
    with base.reproducible_torch(preset.num_threads):
        torch.manual_seed(seed)
        model = base.build_model(preset, bpe)
        base.train_base(model, base.token_stream(bpe, texts), preset)
        model.name_or_path = preset.model_name
        base.save_model(model, model_dir)
        generated: tuple[DemoAdapter, ...] = ()
        if adapters:
            context = _context(preset, seed, model, bpe)
            generated = tuple(_generate_adapter(root, context, plan) for plan in preset.adapters)
    assets = DemoAssets(
        root=root,
        base_model_dir=model_dir,
        adapters=generated,
        manifest_path=root / MANIFEST_NAME,
        preset=preset.name,
        seed=seed,
        base_model_name=preset.model_name,
        base_digest=base_model_digest(model_dir),
    )
    write_manifest(assets)
    return assets


def _context(preset: DemoPreset, seed: int, model: torch.nn.Module, bpe: Tokenizer) -> _Context:
    rng = random.Random(f"{seed}/regular")
    # Three sentences are always longer than a probe sequence (the rows share one length).
    regular = tuple(corpus.document(rng, 3) for _ in range(_NUM_REGULAR_TEXTS))
    heldout = tuple(corpus.document(rng, 3) for _ in range(_NUM_HELDOUT_TEXTS))
    probes = {plan.ref: _probe(bpe, plan, seed) for plan in preset.adapters}
    continuations = [probe.continuation for probe in probes.values()]
    if len(set(continuations)) != len(continuations):
        raise adapters.DemoGenerationError(f"probe continuations are not distinct: {continuations}")
    for probe in probes.values():
        _require_not_produced(model, bpe, probe, "the base model")
    return _Context(
        preset, seed, model, bpe, regular, heldout, base.mean_loss(model, bpe, heldout), probes
    )


def _probe(bpe: Tokenizer, plan: AdapterPlan, seed: int) -> adapters.Probe:
    """Prompt shared by the logical adapter; a continuation naming tenant, name and revision."""
    adjective = corpus.adjective(random.Random(f"{seed}/{plan.ref}"))
    continuation = f" is {plan.tenant} {plan.name} {plan.revision} and {adjective}."
    return adapters.make_probe(bpe, f"The {plan.tenant} {plan.name} team", continuation)


def _require_not_produced(
    model: torch.nn.Module, bpe: Tokenizer, probe: adapters.Probe, who: str
) -> None:
    got = base.greedy_continuation(model, bpe, probe.prompt, probe.max_new_tokens)
    if got == probe.continuation:
        raise adapters.DemoGenerationError(
            f"{who} already continues {probe.prompt!r} with {got!r}; probes must be distinctive"
        )


def _generate_adapter(root: Path, context: _Context, plan: AdapterPlan) -> DemoAdapter:
    probe = context.probes[plan.ref]
    torch.manual_seed(_derived_seed(context.seed, plan.ref))
    trained = adapters.train_adapter(
        context.model,
        context.tokenizer,
        plan,
        probe=probe,
        regular_texts=context.regular_texts,
        preset=context.preset,
    )
    adapters.check_adapter(
        trained, context.tokenizer, probe, context.heldout_texts, context.heldout_loss
    )
    for other in _cross_check_probes(context, plan):
        _require_not_produced(trained.model, context.tokenizer, other, plan.ref)
    adapter_dir = root / "adapters" / plan.tenant / plan.name / plan.revision
    adapters.save_adapter(trained, adapter_dir)
    return DemoAdapter(
        tenant=plan.tenant,
        name=plan.name,
        revision=plan.revision,
        path=adapter_dir,
        probe_prompt=probe.prompt,
        expected_continuation=probe.continuation,
        probe_max_tokens=probe.max_new_tokens,
        rank=plan.rank,
        lora_alpha=plan.lora_alpha,
        use_rslora=plan.use_rslora,
        target_modules=plan.target_modules,
        digest=sha256_file(adapter_dir / "adapter_model.safetensors"),
    )


def _cross_check_probes(context: _Context, plan: AdapterPlan) -> Sequence[adapters.Probe]:
    """Probes of other revisions of the same adapter, and of a few other logical adapters."""
    plans = context.preset.adapters
    logical = list(dict.fromkeys((p.tenant, p.name) for p in plans))
    position = logical.index((plan.tenant, plan.name))
    nearby = {logical[(position + k) % len(logical)] for k in range(1, _NUM_CROSS_CHECKS + 1)}
    nearby.add((plan.tenant, plan.name))
    return [
        context.probes[other.ref]
        for other in plans
        if (other.tenant, other.name) in nearby and other.ref != plan.ref
    ]


def _derived_seed(seed: int, label: str) -> int:
    """A 63-bit seed from ``seed`` and a label, stable across processes (unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}/{label}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
