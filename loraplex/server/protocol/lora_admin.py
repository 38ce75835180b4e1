"""vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (admin credential)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from loraplex.server.protocol.fields import FirstUnknownKeyBody


class LoadLoraAdapterRequest(FirstUnknownKeyBody):
    """vLLM's POST /v1/load_lora_adapter (admin credential, admin listener)."""

    lora_name: str = Field(min_length=1, max_length=512)  # tenant/name or tenant/name@revision
    lora_path: str = Field(min_length=1, max_length=4096)  # a folder inside the import directory


class UnloadLoraAdapterRequest(FirstUnknownKeyBody):
    """vLLM's POST /v1/unload_lora_adapter (admin credential, admin listener)."""

    lora_name: str = Field(min_length=1, max_length=512)  # tenant/name or tenant/name@revision


class LoraAdapterLoaded(BaseModel):
    lora_name: str  # as sent
    model: str  # tenant/name@revision: the exact revision registered (send it as ``model``)
    created: bool  # False: these bytes were already registered under that revision
    tier: str  # the tier it was asked into ("L1": CPU memory)
    status: Literal["resident", "deferred"]  # deferred: the cache declined to load it now
    message: str  # human-readable outcome
    warnings: list[str] = []  # the registration's (``RegistrationResult.warnings``)


class LoraAdapterUnloaded(BaseModel):
    lora_name: str  # as sent
    evicted: dict[str, list[str]]  # tenant/name@revision -> tiers a copy was dropped from
    # without @revision: the last revision of this page when it was full (the next page's
    # ``after``; more may follow); null: no page follows
    next_after: str | None
    message: str  # human-readable outcome
