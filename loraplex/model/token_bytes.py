"""The bytes one token stands for, which chat logprobs' ``bytes`` show.

A token that holds only part of a UTF-8 character decodes alone to U+FFFD. An emoji is 4 such
byte tokens in a byte-level BPE, and so is any character outside a real tokenizer's merges. The
UTF-8 of that U+FFFD is ``[239, 191, 189]``, not the token's byte. OpenAI's ``bytes`` exist so a
client can join a split character's tokens back into it, so they must be the token's own bytes.
They are read from the token's vocabulary string: byte-level BPE (GPT-2's printable stand-in
alphabet, under a ``ByteLevel`` decoder alone or in a ``Sequence``) and SentencePiece's byte
fallback (``<0xF0>``). NOTE: each such token showed ``[239, 191, 189]``, as vLLM's do
(docs/benchmarks/attack30.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer, decoders


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode`` read backwards: each stand-in character to its byte."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_alphabet()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _has_byte_level(decoder: decoders.Decoder | None) -> bool:
    """Whether ``decoder`` is a ``ByteLevel`` one or a ``Sequence`` holding one (LFM2's
    tokenizer.json ships ``{"type": "Sequence", "decoders": [{"type": "ByteLevel"}]}``; the
    Python binding shows a Sequence's parts only in its serialised state). NOTE: only a whole
    ``ByteLevel`` decoder counted, so a Sequence's byte tokens showed U+FFFD's UTF-8."""
    if isinstance(decoder, decoders.ByteLevel):
        return True
    if not isinstance(decoder, decoders.Sequence):
        return False
    return _holds_byte_level(json.loads(decoder.__getstate__()))


def _holds_byte_level(state: Any) -> bool:
    """Whether a decoder's serialised state is, or nests, a ``ByteLevel`` decoder."""
    if not isinstance(state, dict):
        return False
    if state.get("type") == "ByteLevel":
        return True
    parts = state.get("decoders")
    return isinstance(parts, list) and any(_holds_byte_level(part) for part in parts)


class TokenBytes:
    """``bytes_of(token_id, text)``: the bytes of a token whose decode alone (``text``) lost
    them to U+FFFD, read from its vocabulary string; else ``text``'s UTF-8."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._byte_level = _has_byte_level(tokenizer.decoder)

    def bytes_of(self, token_id: int, text: str) -> bytes:
        if "\ufffd" not in text:
            return text.encode("utf-8")
        raw = self._tokenizer.id_to_token(token_id)
        if raw is not None:
            fallback = _BYTE_FALLBACK.fullmatch(raw)
            if fallback is not None:
                return bytes([int(fallback.group(1), 16)])
            if self._byte_level and all(char in _BYTE_LEVEL for char in raw):
                return bytes(_BYTE_LEVEL[char] for char in raw)
        return text.encode("utf-8")
