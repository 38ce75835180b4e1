"""A token's ``bytes`` (chat logprobs) are its own bytes, so a character split over byte tokens
joins back from them: each such token decodes alone to U+FFFD, and its ``bytes`` were that
character's UTF-8, ``[239, 191, 189]`` (docs/benchmarks/attack30.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from loraplex.demo.assets import DemoAssets
from loraplex.model.tokenizer import TextTokenizer

TEXTS = ("\U0001f600", "caf\u00e9", " hello", "\u4e2d\u6587 ok", "a\U0001f680\U0001f600b")


def _demo_tokenizer(assets: DemoAssets) -> TextTokenizer:
    return TextTokenizer(assets.base_model_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_tokens_join_back_into_the_text(demo_assets: DemoAssets, text: str) -> None:
    tokenizer = _demo_tokenizer(demo_assets)
    ids = tokenizer.encode(text)[1:]  # without BOS
    assert b"".join(tokenizer.token_bytes(t) for t in ids).decode("utf-8") == text
    for token_id in ids:
        shown = tokenizer.token_text(token_id)
        if "\ufffd" not in shown:  # a whole token: its bytes are its string's, as before
            assert tokenizer.token_bytes(token_id) == shown.encode("utf-8")


def test_special_tokens_keep_their_string(demo_assets: DemoAssets) -> None:
    tokenizer = _demo_tokenizer(demo_assets)
    (bos,) = tokenizer.encode("")
    assert tokenizer.token_bytes(bos) == tokenizer.token_text(bos).encode("utf-8")


def test_sentencepiece_byte_fallback_tokens_are_their_byte(tmp_path: Path) -> None:
    """Llama 2 / Mistral's layout: ``<0xF0>`` tokens and a ``▁`` word piece."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "▁ok": 257}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    raw.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    tokenizer = TextTokenizer(tmp_path)
    ids = [1 + b for b in "\U0001f600".encode()]
    assert [tokenizer.token_text(t) for t in ids] == ["\ufffd"] * 4
    assert [tokenizer.token_bytes(t) for t in ids] == [bytes([b]) for b in "\U0001f600".encode()]
    assert tokenizer.token_bytes(257) == tokenizer.token_text(257).encode("utf-8")


def _byte_level_tokenizer(tmp_path: Path, decoder: decoders.Decoder) -> TextTokenizer:
    """A byte-level BPE of the 256 byte tokens alone, with ``decoder``."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoder
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}))
    return TextTokenizer(tmp_path)


@pytest.mark.parametrize(
    "decoder",
    [
        # LFM2's tokenizer.json ships its ByteLevel decoder inside a Sequence
        decoders.Sequence([decoders.ByteLevel()]),
        decoders.Sequence([decoders.Sequence([decoders.ByteLevel()]), decoders.Strip(" ", 0, 0)]),
        decoders.ByteLevel(),
    ],
    ids=["sequence", "nested", "whole"],
)
def test_a_byte_level_decoder_inside_a_sequence_gives_byte_tokens_their_byte(
    tmp_path: Path, decoder: decoders.Decoder
) -> None:
    tokenizer = _byte_level_tokenizer(tmp_path, decoder)
    ids = tokenizer.encode("a\U0001f600")
    assert len(ids) == 5
    assert [tokenizer.token_text(t) for t in ids[1:]] == ["\ufffd"] * 4
    # NOTE: in a Sequence each showed U+FFFD's UTF-8, [239, 191, 189]
    assert b"".join(tokenizer.token_bytes(t) for t in ids) == "a\U0001f600".encode()
