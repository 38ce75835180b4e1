"""Prompt lengths refused by ``len()`` alone, before any per-token work.

A token-id prompt costs per id before the context check in the route could refuse it: the
schema's own check (``protocol.fields._token_ids``), pydantic's per item, the vocabulary check
(``prompts._prompt_ids``). Sixteen prompts of 65,536 ids cost about a second of server CPU
on the way to their 400. FastAPI has parsed the JSON body (its bytes capped by ``limits``) before
any dependency runs and validates it against the schema only after them, so this dependency sees
the parsed prompts first and refuses a token-id prompt that cannot fit in the context (the
engine's rule: at least one token must follow it) and a text prompt past ``max_prompt_chars``;
/detokenize's ``tokens`` past ``max_model_len`` likewise.
Anything it does not recognise is left to the schema, which reports it in its own words.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Request

from loraplex.errors import ContextLengthError
from loraplex.sampling import check_prompt_room
from loraplex.server.auth import DepsDep
from loraplex.server.errors import context_error, invalid_request
from loraplex.server.limits import check_prompt_chars
from loraplex.server.protocol import MAX_BATCH_PROMPTS

if TYPE_CHECKING:
    from loraplex.server.deps import ServerConfig


def prompt_lengths(body: object, config: ServerConfig) -> None:
    """Raises the 400 of the first prompt of a parsed completion ``body`` too long to be worth
    validating."""
    if not isinstance(body, dict):
        return
    max_len = config.max_model_len
    for index, prompt in _prompts(body.get("prompt")):
        if isinstance(prompt, str):
            check_prompt_chars(len(prompt), config.max_prompt_chars, "prompt")
        elif max_len is not None:
            check_context(index, len(prompt), max_len)


def detokenize_length(body: object, config: ServerConfig) -> None:
    """/detokenize: more ``tokens`` than any sequence of this server holds is a 400."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    limit = config.max_model_len
    if isinstance(tokens, list) and limit is not None and len(tokens) > limit:
        raise invalid_request(f"tokens has {len(tokens)} ids; expected at most {limit}", "tokens")


async def check_prompt_lengths(request: Request, deps: DepsDep) -> None:
    """``prompt_lengths`` of the body FastAPI parsed (a large body had it where it was parsed,
    ``json_route.py``, and comes here validated)."""
    prompt_lengths(await _parsed_json(request), deps.config)


async def check_detokenize_length(request: Request, deps: DepsDep) -> None:
    """``detokenize_length`` of the body FastAPI parsed (as ``check_prompt_lengths``)."""
    detokenize_length(await _parsed_json(request), deps.config)


# Each check above by the dependency that runs it: ``json_route`` runs a route's before it
# validates a large body off the event loop, so the order of work stays the same.
BodyCheck = Callable[[object, "ServerConfig"], None]  # raises the ApiError of a parsed body
BODY_CHECKS: dict[Callable[..., Awaitable[None]], BodyCheck] = {
    check_prompt_lengths: prompt_lengths,
    check_detokenize_length: detokenize_length,
}


PromptLengthsDep = Annotated[None, Depends(check_prompt_lengths)]
DetokenizeLengthDep = Annotated[None, Depends(check_detokenize_length)]


async def _parsed_json(request: Request) -> Any:
    """The body as FastAPI parsed it (Starlette keeps it); None when FastAPI did not parse it
    as JSON (then the schema refuses it, and parsing it here would be work for nothing). A body
    without a Content-Type is JSON, as the app reads it (``strict_content_type=False``)."""
    content_type = request.headers.get("content-type")
    if content_type is not None and "json" not in content_type.lower():
        return None
    try:
        return await request.json()
    except ValueError:  # not JSON after all: FastAPI has answered it already
        return None


def _prompts(raw: object) -> Iterator[tuple[int | None, str | list[Any]]]:
    """(index in a batch or None, prompt) for each text or token-id list in ``raw``."""
    if isinstance(raw, str):
        yield None, raw
        return
    if not isinstance(raw, list) or not raw:
        return
    if isinstance(raw[0], int):  # one prompt of ids
        yield None, raw
        return
    for index, item in enumerate(raw[: MAX_BATCH_PROMPTS + 1]):
        if isinstance(item, str | list):
            yield index, item


def check_context(index: int | None, num_ids: int, max_len: int, param: str = "prompt") -> None:
    """The 400 of a prompt (``index`` in a batch, None: the only one) of ``num_ids`` ids that
    leaves no room for a token in a context of ``max_len``, naming ``param`` (chat:
    ``messages``): ``sampling.check_prompt_room``, the rule the simulator applies too."""
    which = "the prompt" if index is None else f"prompt {index}"
    try:
        check_prompt_room(num_ids, max_len, which, param)
    except ContextLengthError as exc:
        raise context_error(exc) from None
