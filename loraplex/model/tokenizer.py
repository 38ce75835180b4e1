"""Text <-> token ids through the ``tokenizers`` library, from a checkpoint's ``tokenizer.json``.

Encoding adds the special tokens the tokenizer's post-processor defines (e.g. BOS), as a
transformers fast tokenizer does by default; decoding skips special tokens.

GIL: ``tokenizers``' ``encode`` and ``decode`` hold the GIL for their whole run, its
``encode_batch`` and ``decode_batch`` release it. NOTE: the server tokenizes a tenant's prompt,
``/tokenize`` and ``/detokenize`` on the thread pool (``server/tenant_jobs.py``), but with
``encode`` that thread held the one interpreter lock throughout: 32,768 emoji (131,073 tokens of
the demo tokenizer, within ``max_prompt_chars``) took 274 ms and stopped the event loop and every
other thread for all of it (a thread's 1 ms sleeps woke 274 ms late; 11 ms with
``encode_batch``), so one tenant's prompts held every other tenant's requests for as long as
their tokenizing took (docs/benchmarks/attack15.md). A one-text batch costs about 1 us more a
call; decoding, called per generated token and per logprob entry with one or a few ids (0.4 us,
7 us as a batch), takes the batch only past ``GIL_HELD_DECODE_IDS`` ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from loraplex.errors import CheckpointError
from loraplex.model.token_bytes import TokenBytes

# transformers' clean_up_tokenization: spaces it removes before punctuation and contractions.
_CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


# Longest id list decoded holding the GIL (module docstring): 256 ids decode in about 60 us.
GIL_HELD_DECODE_IDS = 256


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _ids(value: object) -> set[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int) and not isinstance(v, bool)}
    return set()


class TextTokenizer:
    """A checkpoint's tokenizer plus the token ids that end a sequence."""

    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises untyped errors for missing/bad files
            raise CheckpointError(f"{path}: cannot load tokenizer ({exc})") from exc
        settings = _read_json(model_dir / "tokenizer_config.json")
        self._clean_up = bool(settings.get("clean_up_tokenization_spaces", False))
        eos = _ids(_read_json(model_dir / "generation_config.json").get("eos_token_id"))
        eos |= _ids(_read_json(model_dir / "config.json").get("eos_token_id"))
        eos_token = settings.get("eos_token")
        if isinstance(eos_token, dict):
            eos_token = eos_token.get("content")
        if (
            isinstance(eos_token, str)
            and (token_id := self._tokenizer.token_to_id(eos_token)) is not None
        ):
            eos.add(token_id)
        # The ids that end generation (config, generation config and tokenizer config together).
        self.eos_token_ids = frozenset(eos)
        self._bytes = TokenBytes(self._tokenizer)

    @property
    def rewrites_text(self) -> bool:
        """Whether decoding more tokens can change text already decoded (the clean-up of spaces
        before punctuation): ``OutputTracker`` then decodes the whole output each token."""
        return self._clean_up

    def encode(self, text: str) -> list[int]:
        # encode_batch, not encode: see the module docstring (GIL).
        ids: list[int] = self._tokenizer.encode_batch([text])[0].ids
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._decode(token_ids, skip_special=True)

    def token_text(self, token_id: int) -> str:
        """One token's text as logprobs show it: special tokens as themselves (``<|end|>``),
        so two special tokens never share the empty string as vLLM's token strings do not."""
        return self._decode([token_id], skip_special=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes the token stands for (chat logprobs' ``bytes``): a byte token of a split
        character its own byte, not the UTF-8 of the U+FFFD it decodes to alone."""
        return self._bytes.bytes_of(token_id, self.token_text(token_id))

    @property
    def raw(self) -> RawDecoder:
        """This tokenizer's decode without the clean-up (``OutputTracker`` decodes through it
        incrementally and cleans up with ``clean_up``: ``output.CleanedText``)."""
        return RawDecoder(self)

    @staticmethod
    def clean_up_cut(left: str, right: str) -> bool:
        """Where ``clean_up`` may be applied in pieces (``clean_up_cut``)."""
        return clean_up_cut(left, right)

    def clean_up(self, text: str) -> str:
        """What ``decode`` does to the decoded text (nothing unless the tokenizer's config sets
        ``clean_up_tokenization_spaces``)."""
        return clean_up_tokenization(text) if self._clean_up else text

    def _decode(
        self, token_ids: Sequence[int], *, skip_special: bool, clean_up: bool = True
    ) -> str:
        ids = list(token_ids)
        if len(ids) > GIL_HELD_DECODE_IDS:  # the module docstring (GIL)
            text: str = self._tokenizer.decode_batch([ids], skip_special_tokens=skip_special)[0]
        else:
            text = self._tokenizer.decode(ids, skip_special_tokens=skip_special)
        return self.clean_up(text) if clean_up else text


# Adjacent characters, neither a space, inside a ``_CLEANUPS`` pattern ("n'" of " n't"). Every
# pattern starts with a space and its replacement drops only spaces, keeping its last
# character unless that is a space; so between two non-space characters not in this set no
# match of any pass can ever start or end, nor can one that earlier passes bring about.
_JOINED_PAIRS = frozenset(
    before[i : i + 2]
    for before, _ in _CLEANUPS
    for i in range(len(before) - 1)
    if " " not in before[i : i + 2]
)


def clean_up_cut(left: str, right: str) -> bool:
    """Whether ``clean_up_tokenization(a + b) == clean_up_tokenization(a) + ...(b)`` for every
    ``a`` ending with the character ``left`` and ``b`` starting with ``right``."""
    return left != " " and right != " " and left + right not in _JOINED_PAIRS


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: each of ``_CLEANUPS`` replaced in turn."""
    for before, after in _CLEANUPS:
        text = text.replace(before, after)
    return text


class RawDecoder:
    """A ``TextTokenizer``'s decode (special tokens skipped) without the clean-up."""

    rewrites_text = False

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer._decode(token_ids, skip_special=True, clean_up=False)
