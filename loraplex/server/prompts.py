"""A request's prompts before the engine: the shapes ``prompt`` may take (one text, a batch of
texts, token ids, a batch of token-id lists), their characters checked at once, and the
tokenizing (chat messages rendered with the model's template first) returned for later, run
only once the model resolved; the echoed prompts' texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from loraplex.server.chat import ChatMessage, num_prompt_chars
from loraplex.server.choices import Echo
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import invalid_request
from loraplex.server.limits import check_prompt_chars
from loraplex.server.prompt_bounds import check_context
from loraplex.server.protocol import ChatCompletionRequest, Prompt


def prompts_of(prompt: Prompt) -> list[str] | list[list[int]]:
    """A request's prompts: one, or a batch (a list of texts or of token-id lists)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise invalid_request("prompt is an empty list; expected at least one prompt", "prompt")
    texts = [item for item in prompt if isinstance(item, str)]
    if len(texts) == len(prompt):
        return texts
    ids = [item for item in prompt if isinstance(item, int)]
    if len(ids) == len(prompt):
        return [ids]
    return [item for item in prompt if isinstance(item, list)]


def prompt_encoder(
    deps: ServerDeps, prompts: list[str] | list[list[int]]
) -> Callable[[], list[list[int]]]:
    """Checks each text prompt's characters now; returns the tokenizing, run once the model is
    resolved."""
    for prompt in prompts:
        if isinstance(prompt, str):
            check_prompt_chars(len(prompt), deps.config.max_prompt_chars, "prompt")
    return lambda: _encode_all(deps, prompts)


def _encode_all(deps: ServerDeps, prompts: Sequence[str | list[int]]) -> list[list[int]]:
    """Each prompt's ids, in order, stopping at the first that leaves no room for a token in the
    context (the 400 ``prompt_bounds`` gives a token-id prompt). NOTE: a text prompt's length
    is known only once tokenized; tokenizing the whole batch before this check made sixteen
    refused prompts of ``max_prompt_chars`` cost sixteen times one."""
    max_len = deps.config.max_model_len
    encoded = []
    for index, prompt in enumerate(prompts):
        ids = _prompt_ids(deps, prompt)
        if max_len is not None:
            check_context(index if len(prompts) > 1 else None, len(ids), max_len)
        encoded.append(ids)
    return encoded


def _prompt_ids(deps: ServerDeps, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return deps.engine.tokenizer.encode(prompt)
    vocab = deps.config.vocab_size
    if vocab is not None and any(not 0 <= token < vocab for token in prompt):
        raise invalid_request(f"prompt token ids must lie in [0, {vocab})", "prompt")
    return prompt


def echoes(
    deps: ServerDeps, prompts: list[str] | list[list[int]], ids: list[list[int]]
) -> list[Echo]:
    texts = [p if isinstance(p, str) else deps.engine.tokenizer.decode(p) for p in prompts]
    return [Echo(text, prompt_ids[0]) for text, prompt_ids in zip(texts, ids, strict=True)]


def chat_encoder(deps: ServerDeps, body: ChatCompletionRequest) -> Callable[[], list[list[int]]]:
    """Checks the conversation's characters now; returns the rendering and tokenizing, run once
    the model is resolved, which refuses a rendered prompt that leaves no room in the context
    (as a text prompt's). NOTE: without that check an explicit ``max_tokens`` was checked
    first, so the 400 named ``max_tokens`` for a conversation too long by itself."""
    template = deps.chat
    if template is None:
        raise invalid_request("the served model has no chat template; use /v1/completions")
    messages = [ChatMessage(m.role, m.text(), m.name) for m in body.messages]
    check_prompt_chars(num_prompt_chars(messages), deps.config.max_prompt_chars, "messages")
    tokenizer = deps.engine.tokenizer
    max_len = deps.config.max_model_len

    def encode() -> list[list[int]]:
        ids = template.encode(messages, tokenizer, body.reasoning_effort)
        if max_len is not None:
            check_context(None, len(ids), max_len, "messages")
        return [ids]

    return encode
