"""vLLM's utility routes: POST /tokenize and /detokenize (a tenant key), GET /version (public).

Adapters do not change the tokenizer, so every model shares the base model's; ``model`` is still
resolved for the caller exactly as a generation request's is (a foreign private adapter gets the
same 404 as a missing one), so the routes reveal nothing a tenant may not use. Bounds are
generation's: the schema's list caps (``protocol``), prompt characters
(``limits.check_prompt_chars``, each message charged ``chat.MESSAGE_OVERHEAD_CHARS`` too), token
ids below the vocabulary size, the middleware's body cap and rate limit. As in generation, the
cheap checks come first, then the model's resolution, and only then the template and tokenizer.

Where loraplex differs from vLLM: ``model`` absent means the base model; ``token_strs`` are each
id decoded alone, a special token as itself, as logprobs show tokens (vLLM shows raw vocabulary
pieces); ``add_special_tokens`` and
``add_generation_prompt`` are accepted only at the values generation uses (prompt: special
tokens added; chat: the template's own, with the assistant turn opened), else a 400 naming them.
/version is public like vLLM's: it reveals the package version and nothing about tenants.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from loraplex.registry import Tenant
from loraplex.server.auth import DETOKENIZE_PATH, TOKENIZE_PATH, DepsDep, TenantDep
from loraplex.server.chat import ChatMessage, num_prompt_chars
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import invalid_request
from loraplex.server.json_route import StrictJsonRoute
from loraplex.server.limits import check_prompt_chars
from loraplex.server.prompt_bounds import DetokenizeLengthDep
from loraplex.server.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

router = APIRouter(route_class=StrictJsonRoute)  # a repeated JSON key is a 400


async def _check_model(deps: ServerDeps, tenant: Tenant, model: str | None) -> None:
    """Nothing for a model the caller may use; the registry's 404 otherwise."""
    if model is None or model == deps.config.base_model_name:
        return
    await run_in_threadpool(deps.registry.resolve_revision, tenant.name, model)


def _check_fields(body: TokenizeRequest) -> None:
    """Exactly one of prompt and messages, and only the encodings generation uses."""
    if (body.prompt is None) == (body.messages is None):
        raise invalid_request("expected exactly one of prompt and messages", "prompt")
    if body.prompt is not None and body.add_generation_prompt is not None:
        raise invalid_request(
            "add_generation_prompt applies to messages only", "add_generation_prompt"
        )
    if body.add_generation_prompt is False:
        raise invalid_request(
            "add_generation_prompt false is not supported; the chat template always opens the "
            "assistant's turn",
            "add_generation_prompt",
        )
    chat = body.messages is not None
    if body.add_special_tokens is not None and body.add_special_tokens is chat:
        expected = "false (the chat template writes them)" if chat else "true"
        raise invalid_request(
            f"add_special_tokens {str(body.add_special_tokens).lower()} is not supported; "
            f"expected {expected}",
            "add_special_tokens",
        )


def _encoder(deps: ServerDeps, body: TokenizeRequest) -> Callable[[], list[int]]:
    """Checks the prompt's characters now; returns the tokenizing (with the chat template for
    messages), run once the model is resolved."""
    tokenizer = deps.engine.tokenizer
    limit = deps.config.max_prompt_chars
    if body.prompt is not None:
        prompt = body.prompt
        check_prompt_chars(len(prompt), limit, "prompt")
        return lambda: tokenizer.encode(prompt)
    template = deps.chat
    if template is None:
        raise invalid_request("the served model has no chat template; send prompt", "messages")
    messages = [ChatMessage(m.role, m.text(), m.name) for m in body.messages or ()]
    check_prompt_chars(num_prompt_chars(messages), limit, "messages")
    return lambda: template.encode(messages, tokenizer)


def _token_strs(deps: ServerDeps, ids: list[int]) -> list[str]:
    """Each id's text as logprobs show it: a special token as itself (``<|bos|>``). NOTE: it was
    ``decode`` of the id alone, which skips special tokens, so every role marker of a chat
    template and the BOS read as ``""`` (the role markers a user's text can carry were there by
    id only)."""
    token_text = deps.engine.tokenizer.token_text
    return [token_text(token) for token in ids]


@router.post(TOKENIZE_PATH)
async def tokenize(body: TokenizeRequest, tenant: TenantDep, deps: DepsDep) -> TokenizeResponse:
    """The token ids generation would see for this prompt or conversation."""
    _check_fields(body)
    encode = _encoder(deps, body)
    await _check_model(deps, tenant, body.model)
    async with deps.jobs.place(tenant.name):  # a share of the pool (tenant_jobs.py)
        ids = await run_in_threadpool(encode)  # a long prompt must not stall the loop
        strs = await run_in_threadpool(_token_strs, deps, ids) if body.return_token_strs else None
    return TokenizeResponse(
        count=len(ids), max_model_len=deps.config.max_model_len, tokens=ids, token_strs=strs
    )


def _check_ids(deps: ServerDeps, ids: list[int]) -> None:
    vocab = deps.config.vocab_size
    if vocab is not None and any(token >= vocab for token in ids):
        raise invalid_request(f"tokens must lie in [0, {vocab})", "tokens")
    limit = deps.config.max_model_len
    if limit is not None and len(ids) > limit:  # no sequence of this server is longer
        raise invalid_request(f"tokens has {len(ids)} ids; expected at most {limit}", "tokens")


@router.post(DETOKENIZE_PATH)
async def detokenize(
    body: DetokenizeRequest,
    tenant: TenantDep,
    _length: DetokenizeLengthDep,  # NOTE: after the key, before the schema walks the ids
    deps: DepsDep,
) -> DetokenizeResponse:
    """The text ``tokens`` decode to, as output text is decoded (special tokens skipped)."""
    _check_ids(deps, body.tokens)
    await _check_model(deps, tenant, body.model)
    async with deps.jobs.place(tenant.name):
        text = await run_in_threadpool(deps.engine.tokenizer.decode, body.tokens)
    return DetokenizeResponse(prompt=text)


def loraplex_version() -> str:
    """The installed distribution's version (NOTE: the server layer may not import the package
    root, ``tests/test_import_direction.py``; the metadata holds the same number)."""
    return metadata.version("loraplex")


@router.get("/version")
async def version() -> dict[str, str]:
    """The loraplex version (public, as vLLM's)."""
    return {"version": loraplex_version()}
