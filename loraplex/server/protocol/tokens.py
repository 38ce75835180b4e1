"""vLLM's POST /tokenize and /detokenize."""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictBool

from loraplex.server.protocol.chat import Messages
from loraplex.server.protocol.fields import TenantBody, Text, TokenIds


class TokenizeRequest(TenantBody):
    """POST /tokenize: vLLM's two shapes in one body, ``prompt`` or chat ``messages``."""

    model: Text | None = Field(default=None, min_length=1, max_length=512)  # None: the base model
    prompt: Text | None = None  # text, encoded as /v1/completions encodes it
    messages: Messages | None = None  # chat template
    # messages only; only true (the template adds it)
    add_generation_prompt: StrictBool | None = None
    # only the encoding generation uses (module docstring)
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool = False  # also return each token id decoded alone


class TokenizeResponse(BaseModel):
    count: int  # number of tokens
    max_model_len: int | None  # the served context length; None: not known
    tokens: list[int]  # token ids, exactly as generation would see the prompt
    token_strs: list[str] | None = None  # each id decoded alone (with ``return_token_strs``)


class DetokenizeRequest(TenantBody):
    """POST /detokenize."""

    model: Text | None = Field(default=None, min_length=1, max_length=512)  # None: the base model
    tokens: TokenIds  # ids below the vocabulary size


class DetokenizeResponse(BaseModel):
    prompt: str  # the text the ids decode to (special tokens skipped, as in outputs)
