"""Bounded work before a handler runs: credentials from the headers, then a capped, timed body.

FastAPI reads and parses the whole body before any dependency runs, so without this an
unauthenticated client could make the server buffer and parse any amount of data before its 401.
``RequestLimits`` runs first:

- A header the server reads as one value given twice (``SINGLE_HEADERS``: ``Authorization``,
  ``X-Request-Id``, ...) is a 400 naming it: Starlette reads the first and drops the rest.
- ``/v1/*``, /tokenize and /detokenize need a tenant key, ``/admin/*`` and vLLM's
  ``/v1/(un)load_lora_adapter`` the admin key (``auth.required_credential``), checked from the
  headers alone: a wrong one gets its 401 before a byte of the body is read (a tenant key costs
  one registry read, on the thread pool), then the tenant's ``max_requests_per_s`` token bucket
  (429 with Retry-After; shared through Redis when ``shared_state_url`` is set, and then
  checked on the thread pool). The tenant found is left in the scope state for
  ``auth.require_tenant``.
- Every body is counted while the app reads it: a ``Content-Length`` over the cap is a 413 before
  reading, a chunked body a 413 as soon as the count passes the cap, and a body not complete by
  its deadline a 408. The app's own answer to the refused body (it sees an error from
  ``receive``) is discarded and ours sent instead.

Every refusal here closes the connection, so the rest of a body is never read.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import NoReturn

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraplex.errors import RateLimitError
from loraplex.quota.ratelimit import TenantRateLimiter, bucket_capacity
from loraplex.quota.shared_ratelimit import open_rate_limiter
from loraplex.registry import Tenant
from loraplex.server.auth import (
    AUTHORIZATION_NS,
    Credential,
    authenticate,
    check_admin,
    parse_bearer,
    required_credential,
)
from loraplex.server.choices import Shape
from loraplex.server.connections import mark_authenticated
from loraplex.server.deps import ServerDeps
from loraplex.server.errors import (
    MAX_RETRY_AFTER_S,
    ApiError,
    ErrorContext,
    error_response,
    invalid_request,
    to_api_error,
)
from loraplex.server.metrics_status import PRIORITY_CLASS_STATE
from loraplex.server.tenant_jobs import AUTHENTICATED_TENANT

UPLOAD_PATH = "/admin/adapters/upload"  # the one route whose body is an adapter's files
_CLOSE = {"Connection": "close"}
SHARE_CODE = "max_tenant_connection_share"  # the code of a 429 answered on a connection kept open


def body_too_large(max_bytes: int, setting: str = "max_body_bytes") -> ApiError:
    message = f"request body exceeds {max_bytes} bytes ({setting})"
    return ApiError(413, message, "invalid_request_error", "request_too_large", None, dict(_CLOSE))


def upload_too_large(max_bytes: int) -> ApiError:
    message = f"upload exceeds {max_bytes} bytes"
    return ApiError(413, message, "invalid_request_error", "request_too_large", "weights")


def over_connection_share(tenant: str) -> ApiError:
    """A new connection of ``tenant``, which holds its share of the connections while others are
    turned away (``connections.py``): answered and kept open (closed, its room went to the
    tenant's reconnect; open, a newcomer that needs it cuts it)."""
    message = (
        f"tenant {tenant!r} already holds its max_tenant_connection_share of this server's "
        "connections while others are turned away; send on a connection it holds, or retry later"
    )
    headers = {"Retry-After": "1"}
    return ApiError(429, message, "rate_limit_error", SHARE_CODE, None, headers)


def body_timed_out(timeout_s: float) -> ApiError:
    message = f"request body not received within {timeout_s:g} s"
    return ApiError(408, message, "invalid_request_error", "request_timeout", None, dict(_CLOSE))


def check_prompt_chars(num_chars: int, max_chars: int, param: str) -> None:
    """A 400 naming ``param`` for text too long to be worth tokenizing."""
    if num_chars > max_chars:
        raise invalid_request(
            f"{param} has {num_chars} characters; expected at most {max_chars}", param
        )


@dataclass(frozen=True)
class BodyLimit:
    """What one request's body may be."""

    max_bytes: int  # larger bodies get a 413
    timeout_s: float  # the whole body must arrive within this, from the request head on
    setting: str = "max_body_bytes"  # the setting(s) ``max_bytes`` comes from, for the 413


def body_limit(deps: ServerDeps, path: str) -> BodyLimit:
    """The upload route takes an adapter's files (plus an ordinary body's worth of form fields)."""
    config = deps.config
    if path == UPLOAD_PATH:
        max_bytes = config.max_upload_bytes + config.max_body_bytes
        setting = "max_upload_bytes + max_body_bytes"
        return BodyLimit(max_bytes, config.upload_read_timeout_s, setting)
    return BodyLimit(config.max_body_bytes, config.body_read_timeout_s)


class _BodyRefusedError(Exception):
    """Raised into the app by ``receive`` once the body broke its limit."""


class CountedBody:
    """The app's ``receive``: counts the body's bytes and bounds the time until it is complete.

    After the body is complete, calls pass straight through (handlers wait on them to notice a
    client that left, for as long as a stream lasts).
    """

    def __init__(self, receive: Receive, limit: BodyLimit) -> None:
        self._receive = receive
        self._limit = limit
        self._deadline = anyio.current_time() + limit.timeout_s
        self._num_bytes = 0
        self._complete = False
        self.failure: ApiError | None = None  # why the body was refused; None: it was not

    async def __call__(self) -> Message:
        if self.failure is not None:
            raise _BodyRefusedError(self.failure.message)
        if self._complete:
            return await self._receive()
        with anyio.move_on_after(self._deadline - anyio.current_time()):
            message = await self._receive()
            self._count(message)
            return message
        self._refuse(body_timed_out(self._limit.timeout_s))

    def _count(self, message: Message) -> None:
        if message["type"] != "http.request":
            return
        self._num_bytes += len(message.get("body", b""))
        self._complete = not message.get("more_body", False)
        if self._num_bytes > self._limit.max_bytes:
            self._refuse(body_too_large(self._limit.max_bytes, self._limit.setting))

    def _refuse(self, failure: ApiError) -> NoReturn:
        self.failure = failure
        raise _BodyRefusedError(failure.message)


RATE_LIMITER = "loraplex_rate_limiter"  # request state: the limiter that admitted the request


def max_engine_requests(rate: float, burst_s: float) -> int:
    """The most engine requests one HTTP request may cost on a bucket refilling at ``rate``:
    taken from a full bucket, a fan-out of ``count`` leaves it owing ``count - capacity``, and
    the next request waits ``(count + 1 - capacity) / rate``; beyond this that wait would pass
    ``MAX_RETRY_AFTER_S``, the longest Retry-After sent for a debt, so the client told to come
    back then would be refused again (below one request per ``MAX_RETRY_AFTER_S`` this is 0:
    no fan-out at all, whose debt would outlast even the rate's own gap)."""
    capacity = bucket_capacity(rate, burst_s)
    return math.floor(capacity - 1 + rate * MAX_RETRY_AFTER_S)


def check_fan_out(shape: Shape, tenant: Tenant, burst_s: float) -> None:
    """A 400 naming ``n`` (``best_of``, or ``prompt`` for a batch) for a fan-out whose debt no
    Retry-After could express (``max_engine_requests``); nothing was charged for it yet."""
    rate = tenant.quotas.max_requests_per_s
    count = shape.num_siblings
    if rate is None or count <= 1:
        return
    most = max_engine_requests(rate, burst_s)
    if count <= most:
        return
    field_name = "best_of" if shape.ranks else "n"
    param = "prompt" if shape.num_prompts > 1 else field_name
    raise invalid_request(
        f"{shape.num_prompts} prompt(s) x {field_name} {shape.best_of} is {count} engine "
        f"requests; tenant {tenant.name!r} with max_requests_per_s {rate:g} may send at most "
        f"{max(1, most)} in one request (its bucket and {MAX_RETRY_AFTER_S} s of its rate)",
        param,
    )


async def charge_engine_requests(request: Request, tenant: Tenant, shape: Shape) -> None:
    """Charges ``tenant``'s rate quota for the engine requests of one HTTP request beyond the
    first (charged on arrival, before the body was read): a request fanning out into ``n``
    choices over ``p`` prompts costs ``n * p``, so ``n`` cannot multiply a tenant's rate.
    A shared limiter (Redis) is asked on the thread pool, never on the event loop.

    NOTE: the rest passes when the bucket holds what a full one holds less the arrival's
    token (``need``), and is then taken whole, the bucket owing what it lacked: asked to hold
    the whole rest, the arrival's token left it one short forever (``n=4`` on a bucket of 2 was
    refused with ``Retry-After: 1`` however long its tenant waited); capped at the bucket
    instead, a fan-out above it cost one bucket (``n=16`` once a second on a rate of 1 was 16
    engine requests a second). A fan-out the bucket could not repay within the longest
    Retry-After is refused first (``check_fan_out``)."""
    limiter = request.scope.get("state", {}).get(RATE_LIMITER)
    rate = tenant.quotas.max_requests_per_s
    count = shape.num_siblings
    if count <= 1 or limiter is None or rate is None:
        return
    check_fan_out(shape, tenant, limiter.burst_s)
    rest = count - 1
    need = max(0.0, min(rest, bucket_capacity(rate, limiter.burst_s) - 1))
    try:
        if limiter.blocking:
            await run_in_threadpool(limiter.check, tenant, rest, need)
        else:
            limiter.check(tenant, rest, need)
    except RateLimitError as exc:
        raise to_api_error(exc, ErrorContext.TENANT) from None


class RequestLimits:
    """ASGI middleware: authentication from the headers, then a bounded body (module docstring)."""

    def __init__(self, app: ASGIApp, deps: ServerDeps) -> None:
        self.app = app
        self.deps = deps
        # per-tenant token buckets (max_requests_per_s): in this process, or shared in Redis
        config = deps.config
        self.rate_limiter: TenantRateLimiter = open_rate_limiter(
            config.shared_state_url, config.shared_state_prefix
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(self.deps, scope["path"])
        headers = Headers(scope=scope)
        try:
            _check_single_headers(headers)
            _check_declared_length(headers, limit)
            await self._authenticate(scope, headers)
        except ApiError as refused:
            kept = refused.code == SHARE_CODE  # its body is read or the listener closes it
            await (refused if kept else _closing(refused)).response()(scope, receive, send)
            return
        await self._run_counted(scope, receive, send, limit)

    async def _authenticate(self, scope: Scope, headers: Headers) -> None:
        token = parse_bearer(headers.get("authorization"))
        credential = required_credential(scope["path"])
        if credential is Credential.TENANT:
            started_ns = time.time_ns()
            tenant = await authenticate(self.deps, token)
            state = scope.setdefault("state", {})
            if not mark_authenticated(state, tenant.name):  # a valid key, even if over its rate
                raise over_connection_share(tenant.name)
            state[PRIORITY_CLASS_STATE] = tenant.priority.value  # its responses are counted
            try:  # the tenant's max_requests_per_s, before its body costs anything
                await _take_token(self.rate_limiter, tenant)
            except RateLimitError as exc:
                raise to_api_error(exc, ErrorContext.TENANT) from None
            state[AUTHENTICATED_TENANT] = tenant
            state[AUTHORIZATION_NS] = (started_ns, time.time_ns())
            state[RATE_LIMITER] = self.rate_limiter
        elif credential is Credential.ADMIN:
            check_admin(token, self.deps.admin.current())
            mark_authenticated(scope.setdefault("state", {}))

    async def _run_counted(
        self, scope: Scope, receive: Receive, send: Send, limit: BodyLimit
    ) -> None:
        body = CountedBody(receive, limit)
        started = False

        async def send_unless_refused(message: Message) -> None:
            nonlocal started
            if body.failure is not None:
                return  # the app's answer to a refused body: ours goes instead
            started = True
            await send(message)

        try:
            await self.app(scope, body, send_unless_refused)
        except Exception as exc:
            if body.failure is None:
                if started:
                    raise  # the response began: it can only be cut short
                # NOTE: answered here, not by Starlette's ServerErrorMiddleware: that one sends
                # its 500 and re-raises, and uvicorn then drops the keep-alive connection (the
                # client saw a reset, and its next request on the connection failed).
                await error_response(Request(scope), exc)(scope, receive, send)
                return
        # NOTE: every route reads its body before answering; a refusal after the response began
        # can only cut it short (uvicorn then closes the connection).
        if body.failure is not None and not started:
            await body.failure.response()(scope, receive, send)


async def _take_token(limiter: TenantRateLimiter, tenant: Tenant) -> None:
    if limiter.blocking:  # Redis: never on the event loop
        await run_in_threadpool(limiter.check, tenant)
    else:
        limiter.check(tenant)


# Headers the server reads as one value, by their lowercase names (as they are named back).
# NOTE: Starlette's ``headers.get`` returns the first of a repeated header and drops the rest in
# silence: with two ``Authorization`` lines the first key was the caller (an admin key before a
# tenant's reached /admin), so a gateway that checked or set the last one was shown another
# caller than the one served; likewise ``X-Request-Id``, ``X-Session-Id`` (which revision of a
# release answers), ``Content-Type`` and ``Content-Encoding`` (``identity`` first hid ``gzip``).
# ``traceparent`` is not here: given twice it is invalid, a new trace, never an error (W3C Trace
# Context; ``observed.start_trace``).
SINGLE_HEADERS = {
    "authorization": "Authorization",
    "content-type": "Content-Type",
    "content-encoding": "Content-Encoding",
    "x-request-id": "X-Request-Id",
    "x-session-id": "X-Session-Id",
}


def _check_single_headers(headers: Headers) -> None:
    """A 400 naming the first header of ``SINGLE_HEADERS`` given more than once."""
    for name, shown in SINGLE_HEADERS.items():
        if (count := len(headers.getlist(name))) > 1:
            raise invalid_request(f"header {shown} is given {count} times; expected once", shown)


def _check_declared_length(headers: Headers, limit: BodyLimit) -> None:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit.max_bytes:
        raise body_too_large(limit.max_bytes, limit.setting)


def _closing(error: ApiError) -> ApiError:
    return replace(error, headers={**error.headers, **_CLOSE})
