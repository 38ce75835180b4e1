"""GET /v1/models: one card per model a tenant may name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelCard(BaseModel):
    """One entry of /v1/models."""

    id: str  # what to send as ``model``
    object: Literal["model"] = "model"
    created: int  # Unix seconds
    owned_by: str  # owning tenant ("loraplex" for the base model)
    root: str  # tenant/name of an adapter (tenant/name@revision when pinned); the base model's name
    parent: str | None  # the base model for adapters; None for the base model
    max_model_len: int | None  # prompt + output tokens one sequence may hold; None: not known
    signed: bool | None = None  # the owner's own adapters: signed or not; None for the rest


class ModelList(BaseModel):
    """The answer of GET /v1/models (OpenAI's list shape; ``has_more`` is loraplex's)."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
    # more cards follow the last one: ask ``?after=<its id>`` (the unpaged list is capped too)
    has_more: bool = False
