"""OpenAI-compatible request and response bodies (the subset loraplex serves).

Nothing is silently ignored: an unknown field is a 400 naming it (unlike vLLM, which ignores
it), and a field loraplex knows but does not implement is accepted only at its neutral value
(``NEUTRAL``). vLLM's sampling extensions it lists are honoured (docs/operations.md). No
request field is a filesystem path or URL: ``model`` is a name the registry resolves.
Every response carries ``loraplex.revision``: the exact ``tenant/name@revision`` that answered,
and ``loraplex.tier``: the tier the engine leased that revision from (what the request's latency
paid for; where it was cached on arrival only if the engine never reported a tier).

The models are split per endpoint family (``fields``: what they share; ``completions``, ``chat``,
``models``, ``tokens``, ``lora_admin``); this package re-exports every public name, so callers
import ``loraplex.server.protocol`` as before.
"""

from __future__ import annotations

from loraplex.server.batch_limit import MAX_BATCH_PROMPTS
from loraplex.server.protocol.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageIn,
    ChatMessageOut,
    ChatTokenLogprob,
    Messages,
    TextPart,
    TopLogprob,
)
from loraplex.server.protocol.completions import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Prompt,
)
from loraplex.server.protocol.fields import (
    MAX_CHAT_MESSAGES,
    MAX_CONTENT_PARTS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    NEUTRAL,
    RevisionInfo,
    SamplingFields,
    StopText,
    StreamOptions,
    Text,
    TokenIds,
    TopLogprobs,
    Usage,
    same_value,
    unsupported,
)
from loraplex.server.protocol.lora_admin import (
    LoadLoraAdapterRequest,
    LoraAdapterLoaded,
    LoraAdapterUnloaded,
    UnloadLoraAdapterRequest,
)
from loraplex.server.protocol.models import (
    ModelCard,
    ModelList,
)
from loraplex.server.protocol.tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

__all__ = [
    "MAX_BATCH_PROMPTS",
    "MAX_CHAT_MESSAGES",
    "MAX_CONTENT_PARTS",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_TOKEN_IDS",
    "MAX_TOP_LOGPROBS",
    "NEUTRAL",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatDelta",
    "ChatLogprobs",
    "ChatMessageIn",
    "ChatMessageOut",
    "ChatTokenLogprob",
    "CompletionChoice",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionResponse",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "LoadLoraAdapterRequest",
    "LoraAdapterLoaded",
    "LoraAdapterUnloaded",
    "Messages",
    "ModelCard",
    "ModelList",
    "Prompt",
    "RevisionInfo",
    "SamplingFields",
    "StopText",
    "StreamOptions",
    "Text",
    "TextPart",
    "TokenIds",
    "TokenizeRequest",
    "TokenizeResponse",
    "TopLogprob",
    "TopLogprobs",
    "UnloadLoraAdapterRequest",
    "Usage",
    "same_value",
    "unsupported",
]
