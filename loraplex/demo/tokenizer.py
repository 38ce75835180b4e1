"""Train the demo's byte-level BPE tokenizer and write it in Hugging Face layout.

Byte-level means any text tokenizes (unknown words fall back to bytes), so the serving stack
can be fed arbitrary prompts even though the model only learned the demo grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from loraplex.demo.corpus import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS

# Renders OpenAI-style messages with role tokens; generation continues after the assistant tag.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def format_chat(question: str, answer: str) -> str:
    """One training conversation exactly as ``CHAT_TEMPLATE`` renders it (minus the BOS)."""
    return f"<|user|>\n{question}<|end|>\n<|assistant|>\n{answer}<|end|>\n"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE with the demo's special tokens at ids 0.. and a BOS-prepending template."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, model_dir: Path, max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    tokenizer.save(str(model_dir / "tokenizer.json"), pretty=True)
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    config = {
        **special,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    _write_json(model_dir / "tokenizer_config.json", config)
    _write_json(model_dir / "special_tokens_map.json", special)


def _write_json(path: Path, payload: Mapping[str, object]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
