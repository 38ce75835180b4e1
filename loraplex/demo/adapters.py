"""Fine-tune one LoRA adapter revision so its probe prompt yields its own continuation.

Each revision overfits one sequence (probe prompt + its distinctive continuation + EOS) while
also fitting ordinary corpus text, which keeps the adapter close to the base model elsewhere.
Training runs in rounds until every continuation token wins by a logit margin, so greedy
decoding is robust to the small numeric differences of another machine or thread count.

NOTE: imports torch and peft; only the generator loads this module.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer

from loraplex.demo.base import greedy_continuation, mean_loss
from loraplex.demo.corpus import EOS_TOKEN
from loraplex.demo.presets import AdapterPlan, DemoPreset

# Minimum logit lead of every continuation token over the runner-up before training stops.
_MIN_MARGIN = 1.0
# An adapter may raise the held-out corpus loss by at most this factor over the base model.
_MAX_LOSS_RATIO = 1.25
_IGNORE = -100
# Corpus sequences trained next to the probe in every step.
_CORPUS_ROWS = 4


class DemoGenerationError(RuntimeError):
    """The generator could not make an asset meet its contract (a bug, or a bad preset)."""


@dataclass(frozen=True)
class Probe:
    """The fixed prompt of one logical adapter and what one revision must answer to it."""

    prompt: str  # probe prompt, shared by all revisions of a logical adapter
    continuation: str  # this revision's distinctive greedy continuation
    max_new_tokens: int  # continuation tokens + 1 (the EOS that ends generation)


@dataclass(frozen=True)
class TrainedAdapter:
    """A fine-tuned revision, still in memory, and what it was checked against."""

    plan: AdapterPlan  # what was trained
    model: PeftModel  # base copy with this LoRA injected (eval mode)
    steps: int  # optimiser steps taken


def make_probe(tokenizer: Tokenizer, prompt: str, continuation: str) -> Probe:
    num_tokens = len(tokenizer.encode(continuation, add_special_tokens=False).ids)
    return Probe(prompt, continuation, num_tokens + 1)


def lora_config(plan: AdapterPlan, base_name: str) -> LoraConfig:
    """PEFT config for ``plan`` (dropout 0: training must be deterministic and exact)."""
    return LoraConfig(
        r=plan.rank,
        lora_alpha=plan.lora_alpha,
        target_modules=list(plan.target_modules),
        lora_dropout=0.0,
        use_rslora=plan.use_rslora,
        rank_pattern=dict(plan.rank_pattern),
        alpha_pattern=dict(plan.alpha_pattern),
        layers_to_transform=list(plan.layers_to_transform) or None,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_name,
    )


def _probe_batch(tokenizer: Tokenizer, probe: Probe) -> tuple[torch.Tensor, torch.Tensor]:
    prompt_ids = tokenizer.encode(probe.prompt).ids
    full_ids = tokenizer.encode(probe.prompt + probe.continuation + EOS_TOKEN).ids
    if full_ids[: len(prompt_ids)] != prompt_ids:
        raise DemoGenerationError(f"probe {probe.prompt!r}: prompt tokens change when continued")
    labels = [_IGNORE] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    return torch.tensor([full_ids]), torch.tensor([labels])


def _training_batch(
    tokenizer: Tokenizer, probe_ids: torch.Tensor, probe_labels: torch.Tensor, texts: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe row plus corpus rows cut to its length: one forward per step, no padding."""
    length = probe_ids.shape[1]
    rows = [tokenizer.encode(text).ids[:length] for text in texts]
    if min(len(row) for row in rows) < length:
        raise DemoGenerationError(f"corpus texts are shorter than the probe ({length} tokens)")
    regular = torch.tensor(rows)
    return torch.cat([probe_ids, regular]), torch.cat([probe_labels, regular])


def _step_loss(
    model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Probe loss plus corpus loss, each a mean over its own tokens (the probe is one row)."""
    logits = model(input_ids=input_ids).logits[:, :-1]
    targets = labels[:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        reduction="none",
        ignore_index=_IGNORE,
    ).view(targets.shape)
    probe_mask = targets[0] != _IGNORE
    return losses[0][probe_mask].mean() + losses[1:].mean()


def probe_margin(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> float:
    """Smallest lead of a labelled next token's logit over the best other token."""
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[0, :-1]
    targets = labels[0, 1:]
    keep = targets != _IGNORE
    logits, targets = logits[keep], targets[keep]
    chosen = logits.gather(1, targets[:, None])[:, 0]
    others = logits.scatter(1, targets[:, None], float("-inf")).max(dim=1).values
    return float((chosen - others).min())


def with_lora(base: torch.nn.Module, config: LoraConfig) -> PeftModel:
    """``base`` (modified in place) with the LoRA of ``config`` injected. NOTE: peft 0.21 reads
    transformers 5's deprecated ``is_gradient_checkpointing``, whose FutureWarning was the one
    warning a first ``loraplex serve`` printed while it generated the demo: it is not ours to
    act on, so it is silenced here, and only it."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        return get_peft_model(base, config)


def train_adapter(
    base: torch.nn.Module,
    tokenizer: Tokenizer,
    plan: AdapterPlan,
    *,
    probe: Probe,
    regular_texts: Sequence[str],
    preset: DemoPreset,
) -> TrainedAdapter:
    """Fine-tune a fresh LoRA on a copy of ``base`` until the probe wins by ``_MIN_MARGIN``."""
    model = with_lora(copy.deepcopy(base), lora_config(plan, preset.model_name))
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=preset.adapter_lr_for(plan), weight_decay=0.0)
    probe_ids, probe_labels = _probe_batch(tokenizer, probe)
    steps = 0
    for _ in range(preset.adapter_max_rounds):
        model.train()
        for _ in range(preset.adapter_steps_per_round):
            start = (steps * _CORPUS_ROWS) % (len(regular_texts) - _CORPUS_ROWS)
            batch, labels = _training_batch(
                tokenizer, probe_ids, probe_labels, regular_texts[start : start + _CORPUS_ROWS]
            )
            _step_loss(model, batch, labels).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
        model.eval()
        if probe_margin(model, probe_ids, probe_labels) >= _MIN_MARGIN:
            return TrainedAdapter(plan, model, steps)
    raise DemoGenerationError(
        f"{plan.ref}: probe continuation not learned within {steps} steps; raise "
        "adapter_max_rounds or adapter_lr in the preset"
    )


def check_adapter(
    trained: TrainedAdapter,
    tokenizer: Tokenizer,
    probe: Probe,
    heldout_texts: Sequence[str],
    base_heldout_loss: float,
) -> None:
    """Greedy decode must give exactly the continuation; corpus loss must stay near the base's."""
    got = greedy_continuation(trained.model, tokenizer, probe.prompt, probe.max_new_tokens)
    if got != probe.continuation:
        raise DemoGenerationError(
            f"{trained.plan.ref}: greedy continuation of {probe.prompt!r} is {got!r}, "
            f"expected {probe.continuation!r}"
        )
    heldout = mean_loss(trained.model, tokenizer, heldout_texts)
    if heldout > base_heldout_loss * _MAX_LOSS_RATIO:
        raise DemoGenerationError(
            f"{trained.plan.ref}: held-out corpus loss {heldout:.3f} exceeds "
            f"{_MAX_LOSS_RATIO} x the base model's {base_heldout_loss:.3f}"
        )


def save_adapter(trained: TrainedAdapter, adapter_dir: Path) -> None:
    """adapter_config.json + adapter_model.safetensors, as PEFT writes them."""
    # NOTE: PEFT keeps target_modules as a set and writes list(set): string hashing is salted
    # per process, so the order (and the file's bytes) would vary between runs.
    config = trained.model.peft_config["default"]
    if not isinstance(config, LoraConfig):
        raise DemoGenerationError(f"{trained.plan.ref}: PEFT config is {type(config).__name__}")
    config.target_modules = list(trained.plan.target_modules)
    # save_embedding_layers=False: "auto" would look the base model name up on the Hub.
    trained.model.save_pretrained(
        str(adapter_dir), safe_serialization=True, save_embedding_layers=False
    )
    readme = adapter_dir / "README.md"
    # PEFT's model card is boilerplate for a Hub upload; the manifest describes the adapter.
    readme.unlink(missing_ok=True)
