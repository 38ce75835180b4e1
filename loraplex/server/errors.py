"""The one mapping of domain exceptions to HTTP statuses and OpenAI-shaped error bodies.

Every error a client sees has the body ``{"error": {"message", "type", "param", "code"}}`` that
the official OpenAI clients parse. Handlers act on exception types, never on message text.

- Transient (``CapacityError``): the same request may succeed later: 429 (queue full, rate
  limit) or 503 (queue timeout, engine down, a budget busy now), always with ``Retry-After``.
- Permanent (``UnservableError``): this server can never serve the request as sent: 400 (prompt
  too long, code ``context_length_exceeded`` as OpenAI's; adapters not served) or 422 (adapter
  too large for any tier), never with ``Retry-After``, so clients do not retry in vain.
- Bad input (``InvalidRequestError``, request validation): 400 naming the field.
- Adapter problems depend on who asked: on the admin API they describe the adapter being
  registered (the caller's input, 422); on the tenant API they mean a registered revision failed
  to load (the service's fault, 500), so the tenant is told which revision and nothing about
  files.
- Anything else is a bug: a 500 whose body says "internal error" and an id, never the
  exception's text (it may hold paths, or another tenant's values); the log has the text
  under that id. A ``ValueError`` is a bug too, except on the admin API (see ``_admin_value``).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from loraplex.errors import (
    AdapterError,
    AdapterNotFoundError,
    AdapterTooLargeError,
    ArtifactNotFoundError,
    AuthenticationError,
    CapacityError,
    ContextLengthError,
    EngineUnavailableError,
    GenerationError,
    InvalidRequestError,
    LoadCancelledError,
    LoraplexError,
    MergedRevisionError,
    NoAdapterCacheError,
    PathOutsideStoreError,
    PromptTooLongError,
    QueueFullError,
    QueueTimeoutError,
    RateLimitError,
    RecordNotFoundError,
    RegistryError,
    RegistryUnavailableError,
    RevisionConflictError,
    TenantCapTooSmallError,
    UnservableError,
    clipped,
)
from loraplex.quota.ratelimit import longest_wait_s
from loraplex.registry.models import TenantQuotas
from loraplex.release.errors import InvalidTransitionError, ReleaseConflictError
from loraplex.server.body_errors import (
    DuplicateKeyError,
    EncodedBody,
    InvalidBody,
    huge_integer,
    too_deep,
    unsupported_content_type,
)
from loraplex.server.tenant_jobs import caller_of

_log = logging.getLogger(__name__)

# Retry-After (seconds) for capacity errors that carry no estimate of their own.
DEFAULT_RETRY_AFTER_S = 1.0
ADMIN_PREFIX = "/admin"
# A validation message longer than this is cut: validators may quote the caller's value.
MAX_VALIDATION_MESSAGE_CHARS = 512
# What a key no body model declares gets, after its name (pydantic's "Extra inputs are not
# permitted" did not say that the server knows no such field, nor why it is not just ignored).
UNKNOWN_FIELD = (
    "unknown field; loraplex refuses a field it does not implement rather than ignore it"
)
# How other servers' clients pick an adapter (LoRAX's ``adapter_id`` / ``adapter_source``,
# vLLM's offline ``lora_request``): here ``model`` names it, which the refusal says.
ADAPTER_FIELDS = frozenset({"adapter_id", "adapter_source", "lora_request"})
NAME_THE_ADAPTER = "; name the adapter in model (name, tenant/name, either with @revision)"
# A tenant's quota sent beside ``priority`` in ``/admin/tenants`` bodies: it is implemented, one
# level down, so "does not implement" alone sent the operator looking for a missing feature.
QUOTA_FIELDS = frozenset(f.name for f in fields(TenantQuotas))
TENANTS_PATH = "/admin/tenants"


class ErrorContext(StrEnum):
    """Who is asking, which decides what an adapter error means."""

    TENANT = "tenant"  # the OpenAI-compatible API
    ADMIN = "admin"  # the administrative API


@dataclass(eq=False)
class ApiError(Exception):
    """An error ready to send: status, OpenAI error fields and extra headers.

    NOTE: not frozen: the interpreter and contextlib assign ``__traceback__`` on exceptions.
    """

    status: int  # HTTP status code
    message: str  # human-readable, safe to show the caller
    type: str  # OpenAI error type, e.g. "invalid_request_error"
    code: str | None = None  # machine-readable code, e.g. "model_not_found"
    param: str | None = None  # the request field at fault, if any
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Retry-After, WWW-Authenticate

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": _encodable(self.message),
                "type": self.type,
                "param": None if self.param is None else _encodable(self.param),
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _encodable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud800``). NOTE: a message or
    param may quote the caller's JSON keys, which ``json`` parses to any code point, lone
    surrogates too; the response is UTF-8, which cannot hold one, so a key ``"\\ud800"`` given
    twice (or holding a too long integer) made the 400 itself fail, a 500."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", "invalid_request", param)


# The one body of a 404 for a path this listener does not route, whatever the path: a route of
# the other listener (``listeners.sockets.AdminBindGuard``) answers the same, so a caller cannot
# tell it from a path that does not exist. It says what a client ported from another server
# reached for and where the routes are ("Not Found" alone did not), and that a trailing slash is
# not redirected: vLLM's FastAPI app answers ``POST /v1/completions/`` with a 307 to the path
# without it (Starlette's ``redirect_slashes``), which loraplex turns off (``server/app.py``: a
# redirect would reveal a route of the other listener).
NO_ROUTE_MESSAGE = (
    "no such route on this listener; loraplex's OpenAI API is POST /v1/completions, "
    "POST /v1/chat/completions and GET /v1/models (no embeddings, responses or audio routes), "
    "and GET /openapi.json on the API listener lists every tenant route; a path takes no "
    "trailing slash (/v1/completions, not /v1/completions/)"
)


def no_route() -> ApiError:
    return ApiError(404, NO_ROUTE_MESSAGE, "not_found_error")


def unauthorized(message: str = "invalid API key") -> ApiError:
    headers = {"WWW-Authenticate": "Bearer"}
    return ApiError(401, message, "authentication_error", "invalid_api_key", None, headers)


# A hint beyond an hour is no hint (an absurd estimate cannot inflate it); except a rate quota's,
# whose wait is the quota's own (``quota.ratelimit.longest_wait_s``).
MAX_RETRY_AFTER_S = 3600


def _retry_after(seconds: float, most_s: float = MAX_RETRY_AFTER_S) -> dict[str, str]:
    """Whole seconds, rounded up (never earlier than ``seconds``), 1 to ``most_s``."""
    return {"Retry-After": str(max(1, math.ceil(min(most_s, seconds))))}


def _capacity(exc: CapacityError) -> ApiError:
    if isinstance(exc, QueueFullError):
        headers = _retry_after(exc.retry_after_s)
        return ApiError(429, str(exc), "rate_limit_error", "queue_full", None, headers)
    if isinstance(exc, RateLimitError):
        headers = _retry_after(exc.retry_after_s, longest_wait_s(exc.rate_per_s))
        return ApiError(429, str(exc), "rate_limit_error", "rate_limited", None, headers)
    if isinstance(exc, QueueTimeoutError):
        headers = _retry_after(exc.retry_after_s)
        return ApiError(503, str(exc), "server_error", "queue_timeout", None, headers)
    headers = _retry_after(DEFAULT_RETRY_AFTER_S)
    if isinstance(exc, EngineUnavailableError):
        return ApiError(503, str(exc), "server_error", "engine_unavailable", None, headers)
    if isinstance(exc, RegistryUnavailableError):
        return ApiError(503, str(exc), "server_error", "registry_unavailable", None, headers)
    return ApiError(503, str(exc), "server_error", "capacity_exceeded", None, headers)


def context_error(exc: ContextLengthError) -> ApiError:
    """The 400 of a request that leaves no room in the context (``sampling``'s rules), naming
    the field to reduce."""
    return ApiError(400, str(exc), "invalid_request_error", "context_length_exceeded", exc.param)


def _unservable(exc: UnservableError, prompt_param: str) -> ApiError:
    kind = "invalid_request_error"
    if isinstance(exc, ContextLengthError):
        return context_error(exc)
    if isinstance(exc, PromptTooLongError):
        return ApiError(400, str(exc), kind, "context_length_exceeded", prompt_param)
    if isinstance(exc, TenantCapTooSmallError):  # the operator's cap, not the adapter
        return ApiError(422, str(exc), kind, "tenant_cap_too_small", None)
    if isinstance(exc, AdapterTooLargeError):
        return ApiError(422, str(exc), kind, "adapter_too_large", "model")
    if isinstance(exc, NoAdapterCacheError):
        return ApiError(400, str(exc), kind, "adapters_not_served", "model")
    return ApiError(400, str(exc), kind, "unservable_request")


def internal_error(exc: BaseException) -> ApiError:
    """A 500 that names only an id; the exception, under that id, goes to the log."""
    error_id = f"err-{secrets.token_hex(8)}"
    _log.error("internal error %s: %r", error_id, exc, exc_info=exc)
    return ApiError(500, f"internal error (id {error_id})", "server_error", "internal_error")


def _admin_value(exc: ValueError) -> ApiError:
    """NOTE: the admin API hands operators' values to the registry's records, which validate
    them with ``ValueError`` naming the field (STYLE rule 3), so there it means bad input. The
    tenant API validates its input itself and raises ``InvalidRequestError``."""
    return invalid_request(str(exc))


def to_api_error(
    exc: BaseException, context: ErrorContext, prompt_param: str = "prompt"
) -> ApiError:
    """The response for ``exc``; anything unexpected becomes a 500 that reveals nothing.
    ``prompt_param`` names the field a too-long prompt came from (chat: ``messages``)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, AuthenticationError):
        return unauthorized()
    if isinstance(exc, AdapterNotFoundError):
        # NOTE: the registry words this identically for missing and foreign-private adapters.
        return ApiError(404, str(exc), "invalid_request_error", "model_not_found", "model")
    if isinstance(exc, InvalidRequestError):
        return invalid_request(str(exc), exc.param)
    if isinstance(exc, CapacityError):
        return _capacity(exc)
    if isinstance(exc, UnservableError):
        return _unservable(exc, prompt_param)
    if isinstance(exc, GenerationError):
        return ApiError(422, str(exc), "invalid_request_error", "generation_failed")
    if isinstance(exc, AdapterError | LoadCancelledError | ArtifactNotFoundError):
        if context is ErrorContext.ADMIN:
            return ApiError(422, str(exc), "invalid_request_error", "invalid_adapter")
        message = "the adapter revision could not be loaded; an operator has to fix or replace it"
        return ApiError(500, message, "server_error", "adapter_load_failed")
    if isinstance(exc, RecordNotFoundError):
        return ApiError(404, str(exc), "invalid_request_error", "not_found")
    if isinstance(exc, RevisionConflictError):
        return ApiError(409, str(exc), "invalid_request_error", "revision_conflict")
    if isinstance(exc, MergedRevisionError):
        return ApiError(409, str(exc), "invalid_request_error", "revision_merged")
    if isinstance(exc, InvalidTransitionError | ReleaseConflictError):
        # the release is not in a state that allows it (or another actor moved it first)
        return ApiError(409, str(exc), "invalid_request_error", "release_conflict")
    if isinstance(exc, PathOutsideStoreError):
        return invalid_request(str(exc), "path")
    if isinstance(exc, RegistryError):
        return invalid_request(str(exc))
    if isinstance(exc, ValueError) and context is ErrorContext.ADMIN:
        return _admin_value(exc)
    return internal_error(exc)


def context_of(request: Request) -> ErrorContext:
    path = request.url.path
    if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
        return ErrorContext.ADMIN
    return ErrorContext.TENANT


async def _on_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(request, exc)


def error_response(request: Request, exc: Exception) -> JSONResponse:
    """The OpenAI-shaped answer to ``exc`` raised while serving ``request``."""
    chat = request.url.path.endswith("/chat/completions")
    return to_api_error(exc, context_of(request), "messages" if chat else "prompt").response()


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})
# What a union member whose type the value does not have reports.
_MEMBER_TYPE_ERRORS = frozenset(
    {
        "string_type",
        "int_type",
        "float_type",
        "bool_type",
        "list_type",
        "dict_type",
        "none_required",
    }
)
# Where FastAPI found a value; the field's name follows (``query.top`` is the field ``top``).
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})


def _is_union_tag(part: object) -> bool:
    """Pydantic names the union member in an error's location (``str``, ``list[int]``,
    ``function-after[...]``); it is not a field of the request."""
    return isinstance(part, str) and ("[" in part or part in _TYPE_TAGS)


def _reason(error: Mapping[str, Any]) -> str:
    """What a validation error says: a check of our own, its own words. NOTE: pydantic's
    ``msg`` of a ``ValueError`` raised in a validator is "Value error, " + its text, and that
    prefix reached tenants (``stop: Value error, has 5 stop strings; expected at most 4``)."""
    if error.get("type") == "value_error":
        raised = (error.get("ctx") or {}).get("error")
        if isinstance(raised, ValueError):
            return str(raised)
    return str(error.get("msg", "invalid value"))


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestValidationError):
        return await _on_error(request, exc)
    errors = exc.errors()
    # A failed check of our own (a value error) says most; then a member of a union the value
    # has the type of (``stop: ["x" * 5000]``: "at most 1024 characters", not the str member's
    # "Input should be a valid string"); the union's other members say least.
    first = next((e for e in errors if e.get("type") == "value_error"), None)
    first = first or next((e for e in errors if e.get("type") not in _MEMBER_TYPE_ERRORS), None)
    first = first or (errors[0] if errors else {})
    if first.get("type") == "json_invalid":  # its location is a character offset, not a field
        where = "".join(str(p) for p in first.get("loc", ()) if p != "body")
        return invalid_request(f"body is not valid JSON (at character {clipped(where)})").response()
    if first.get("loc") == ("body",) and first.get("type") == "model_attributes_type":
        # the model got the raw bytes: FastAPI parses JSON only without a type or with JSON's
        problem = unsupported_content_type(request.headers.get("content-type"))
        if problem is not None:
            return invalid_request(problem.message, problem.param).response()
    location = [str(p) for p in first.get("loc", ()) if p not in _SOURCES and not _is_union_tag(p)]
    param = clipped(".".join(location)) or None  # an unknown key is the caller's own text
    reason = clipped(_reason(first), MAX_VALIDATION_MESSAGE_CHARS)
    if first.get("type") == "extra_forbidden":  # pydantic's "Extra inputs are not permitted"
        reason = UNKNOWN_FIELD + (NAME_THE_ADAPTER if param in ADAPTER_FIELDS else "")
        if param in QUOTA_FIELDS and request.url.path.startswith(TENANTS_PATH):
            reason = f'a tenant quota goes under quotas: {{"quotas": {{"{param}": ...}}}}'
    message = f"{param or 'request'}: {reason}"
    return invalid_request(message, param).response()


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, StarletteHTTPException):
        return await _on_error(request, exc)
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, DuplicateKeyError):  # json_route.py
        return invalid_request(f"body: {cause}", clipped(cause.key)).response()
    if exc.status_code == 400 and isinstance(cause, EncodedBody):  # json_route.py
        return invalid_request(cause.problem.message, cause.problem.param).response()
    if exc.status_code == 400 and isinstance(cause, InvalidBody):  # validated off the loop
        return await _on_validation(request, cause.error)
    if exc.status_code == 400 and isinstance(cause, ApiError):  # a length check there
        return cause.response()
    if exc.status_code == 400 and isinstance(cause, RecursionError):  # nested past the parser
        deep = too_deep()
        return invalid_request(deep.message, deep.param).response()
    if exc.status_code == 400 and isinstance(cause, ValueError):
        # FastAPI's "error parsing the body" (a JSON syntax error is a validation error instead);
        # the body was read, so ``body()`` returns it again
        try:
            # NOTE: off the event loop (it parses the body again, up to max_body_bytes), in one
            # of the tenant's places on the pool (tenant_jobs.py)
            jobs = request.app.state.deps.jobs
            problem = await jobs.run(caller_of(request.scope), huge_integer, await request.body())
        except RuntimeError:  # read as a stream, not kept: nothing to say about it
            problem = None
        if problem is not None:
            return invalid_request(problem.message, problem.param).response()
    if exc.status_code == 404:  # the router's: no route has this path (no route raises one)
        return no_route().response()
    headers = dict(exc.headers or {})
    message = str(exc.detail)
    if exc.status_code == 405 and headers.get("Allow"):  # the router's: the path, not the method
        method, allowed = clipped(request.method), headers["Allow"]
        message = f"method {method} is not allowed on this route; expected {allowed}"
    code = "invalid_request" if exc.status_code == 400 else None  # e.g. a body that is not UTF-8
    error = ApiError(exc.status_code, message, "invalid_request_error", code, None, headers)
    return error.response()


def install_error_handlers(app: FastAPI) -> None:
    """Every error path of ``app`` answers in the OpenAI error shape."""
    app.add_exception_handler(ApiError, _on_error)
    app.add_exception_handler(LoraplexError, _on_error)
    app.add_exception_handler(ValueError, _on_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_error)
