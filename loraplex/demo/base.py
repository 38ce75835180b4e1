"""Build, briefly train and save the demo's Llama-architecture base model.

NOTE: imports torch and transformers; only the generator (never the package's import path)
loads this module.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from loraplex.demo import corpus
from loraplex.demo.corpus import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN
from loraplex.demo.presets import AdapterPlan, DemoPreset
from loraplex.demo.tokenizer import format_chat

# Fraction of base training texts that are chat-template conversations.
_CHAT_FRACTION = 0.25
_SENTENCES_PER_DOCUMENT = 4
# Fractions of sentences naming an adapter's team or a revision label: adapters' probe
# continuations use these words, and a token the base never emits is too costly to teach a LoRA.
_TEAM_FRACTION = 0.15
_REVISION_FRACTION = 0.05


@contextmanager
def reproducible_torch(num_threads: int) -> Iterator[None]:
    """Fixed thread count, deterministic kernels and a private RNG; restores all three after.

    Reduction order in CPU matmuls can depend on the thread count, so the count is fixed for
    byte-identical weights across runs; callers' global torch state is left as it was.
    """
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(num_threads)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def base_texts(rng: random.Random, count: int, plans: Sequence[AdapterPlan]) -> list[str]:
    """Training texts: short paragraphs (some naming adapters) and chat conversations."""
    texts = []
    for _ in range(count):
        if rng.random() < _CHAT_FRACTION:
            turn = corpus.chat_turn(rng)
            texts.append(format_chat(turn.question, turn.answer))
        else:
            sentences = (_mixed_sentence(rng, plans) for _ in range(_SENTENCES_PER_DOCUMENT))
            texts.append(" ".join(sentences) + EOS_TOKEN)
    return texts


def _mixed_sentence(rng: random.Random, plans: Sequence[AdapterPlan]) -> str:
    draw = rng.random()
    if draw < _TEAM_FRACTION:
        plan = rng.choice(plans)
        return corpus.team_sentence(rng, plan.tenant, plan.name)
    if draw < _TEAM_FRACTION + _REVISION_FRACTION:
        return corpus.revision_sentence(rng, rng.choice(plans).revision)
    return corpus.sentence(rng)


def token_stream(tokenizer: Tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """All texts encoded (each starting with BOS) and concatenated into one 1-D id tensor."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids.extend(encoding.ids)
    return torch.tensor(ids, dtype=torch.long)


def build_model(preset: DemoPreset, tokenizer: Tokenizer) -> LlamaForCausalLM:
    """A freshly initialised float32 Llama with grouped-query attention and untied embeddings."""
    bos_id, eos_id, pad_id = (_token_id(tokenizer, t) for t in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN))
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return model


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"tokenizer has no {token!r}; expected the demo's special tokens")
    return int(token_id)


def train_base(model: LlamaForCausalLM, stream: torch.Tensor, preset: DemoPreset) -> float:
    """Next-token training on random windows of ``stream``; returns the last step's loss."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.base_lr, weight_decay=0.0)
    warmup = max(1, preset.base_steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * (1.0 - step / preset.base_steps)
    )
    window = preset.base_seq_tokens
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(preset.base_steps):
        starts = torch.randint(
            0, stream.numel() - window, (preset.base_batch_size,), generator=generator
        )
        batch = torch.stack([stream[start : start + window] for start in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()  # type: ignore[no-untyped-call]
    return float(loss.detach())


def save_model(model: LlamaForCausalLM, model_dir: Path) -> None:
    """config.json, generation_config.json and model.safetensors (no absolute paths inside).
    NOTE: without transformers' progress bar, whose "Writing model shards: 100%|####| 1/1"
    for one small file was, with a FutureWarning, the noise of a first ``loraplex serve``."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        model.save_pretrained(str(model_dir))
    finally:
        if shown:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def greedy_continuation(model: Any, tokenizer: Tokenizer, prompt: str, max_new_tokens: int) -> str:
    """Greedy continuation text of ``prompt`` (special tokens dropped, stops at EOS)."""
    prompt_ids = tokenizer.encode(prompt).ids
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    new_ids = output[0, len(prompt_ids) :].tolist()
    return str(tokenizer.decode(new_ids, skip_special_tokens=True))


def mean_loss(model: torch.nn.Module, tokenizer: Tokenizer, texts: Sequence[str]) -> float:
    """Mean next-token loss over ``texts`` (one forward each), for drift checks."""
    total = 0.0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids], dtype=torch.long)
            total += float(model(input_ids=ids, labels=ids).loss)
    return total / len(texts)
