"""Tiny random Llama/Mistral/Qwen2 checkpoints (saved by transformers) and comparison helpers.

A uniquely named module (not conftest) so test files can import it unambiguously."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.1,
    "eos_token_id": 2,
    "bos_token_id": 1,
}


def save_tiny_model(out: Path, arch: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """Random checkpoint of ``arch`` saved with save_pretrained (safetensors) in ``out``."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **overrides}))
    with torch.no_grad():
        # Non-trivial norms and biases so a wrong formula cannot hide behind ones and zeros.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0, 0.1)
    model.save_pretrained(out)
    return out


def hf_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager"
    )
    return model.eval()


def rel_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.float(), theirs.float()
    return float((ours - theirs).abs().max() / theirs.abs().max())


def save_word_tokenizer(model_dir: Path, vocab_size: int = 97) -> None:
    """A whitespace word-level tokenizer: ``<unk>``=0, ``<s>``=1 (prepended), ``</s>``=2, then
    ``w3 .. w{vocab_size-1}``; decoding joins words with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tokenizer.save(str(model_dir / "tokenizer.json"))


def words(token_ids: list[int]) -> str:
    return " ".join(f"w{t}" for t in token_ids)


def vm_flags(tensor: torch.Tensor) -> set[str]:
    """The VmFlags of the mapping holding ``tensor``'s first byte (``/proc/self/smaps``)."""
    address, inside = tensor.data_ptr(), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(part, 16) for part in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")
