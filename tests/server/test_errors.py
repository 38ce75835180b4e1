"""The one error mapping: statuses, OpenAI error bodies, Retry-After only for transient errors,
and 500s that reveal nothing but an id."""

from __future__ import annotations

import logging

import pytest

from loraplex.errors import (
    AdapterNotFoundError,
    AdapterTooLargeError,
    AuthenticationError,
    CacheIntegrityError,
    CapacityError,
    ContextLengthError,
    CorruptArtifactError,
    DigestMismatchError,
    EngineUnavailableError,
    GenerationError,
    InvalidRequestError,
    LoadCancelledError,
    NoAdapterCacheError,
    PathOutsideStoreError,
    PromptTooLongError,
    QueueFullError,
    QueueTimeoutError,
    RateLimitError,
    RegistryError,
    RegistryUnavailableError,
    RevisionConflictError,
    TenantCapTooSmallError,
    TensorValidationError,
    UnservableError,
)
from loraplex.server.errors import ErrorContext, to_api_error

TENANT = ErrorContext.TENANT
ADMIN = ErrorContext.ADMIN


@pytest.mark.parametrize(
    ("exc", "context", "status", "code"),
    [
        (AuthenticationError("x"), TENANT, 401, "invalid_api_key"),
        (AdapterNotFoundError("model 'm' does not name an adapter available to you"), TENANT, 404,
         "model_not_found"),
        (QueueFullError("tenant acme's queue", 8, 2.5), TENANT, 429, "queue_full"),
        (QueueTimeoutError("r1", 30.0, 4.0), TENANT, 503, "queue_timeout"),
        (CapacityError("never fits"), TENANT, 503, "capacity_exceeded"),
        (EngineUnavailableError("the engine process exited"), TENANT, 503, "engine_unavailable"),
        (RegistryUnavailableError("lock timeout (5 s) expired"), TENANT, 503,
         "registry_unavailable"),
        (RateLimitError("acme", 2.0, 0.5), TENANT, 429, "rate_limited"),
        (GenerationError("r1", "non-finite logits"), TENANT, 422, "generation_failed"),
        (CorruptArtifactError("bad"), TENANT, 500, "adapter_load_failed"),
        (DigestMismatchError("w", "a", "b"), TENANT, 500, "adapter_load_failed"),
        (LoadCancelledError("gone"), TENANT, 500, "adapter_load_failed"),
        (TensorValidationError("bad shape"), ADMIN, 422, "invalid_adapter"),
        (RevisionConflictError("differs"), ADMIN, 409, "revision_conflict"),
        (PathOutsideStoreError("../x"), ADMIN, 400, "invalid_request"),
        (RegistryError("tenant exists"), ADMIN, 400, "invalid_request"),
        (PromptTooLongError("2049 tokens"), TENANT, 400, "context_length_exceeded"),
        (NoAdapterCacheError("base model only"), TENANT, 400, "adapters_not_served"),
        (AdapterTooLargeError("9 GB"), TENANT, 422, "adapter_too_large"),
        (TenantCapTooSmallError("max_gpu_bytes 1"), TENANT, 422, "tenant_cap_too_small"),
        (UnservableError("never"), TENANT, 400, "unservable_request"),
        (InvalidRequestError("bad template", "messages"), TENANT, 400, "invalid_request"),
        (ValueError("tier 'L9' is invalid"), ADMIN, 400, "invalid_request"),
        (ValueError("max_tokens 0 is invalid"), TENANT, 500, "internal_error"),
        (CacheIntegrityError("refcount", "-1"), TENANT, 500, "internal_error"),
        (RuntimeError("secret internals"), TENANT, 500, "internal_error"),
    ],
)  # fmt: skip
def test_mapping(exc: Exception, context: ErrorContext, status: int, code: str) -> None:
    error = to_api_error(exc, context)
    assert (error.status, error.code) == (status, code)
    body = error.body()["error"]
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}


TRANSIENT = [
    QueueFullError("q", 8, 2.0),
    RateLimitError("acme", 1.0, 2.0),
    QueueTimeoutError("r", 1.0, 2.0),
    EngineUnavailableError("restarting"),
    RegistryUnavailableError("no connection within 5 s"),
    CapacityError("busy"),
]
PERMANENT = [
    PromptTooLongError("long"),
    AdapterTooLargeError("big"),
    NoAdapterCacheError("none"),
    UnservableError("never"),
]


@pytest.mark.parametrize("exc", TRANSIENT)
def test_transient_errors_are_429_or_503_with_retry_after(exc: CapacityError) -> None:
    error = to_api_error(exc, TENANT)
    assert error.status in (429, 503)
    assert int(error.headers["Retry-After"]) >= 1


@pytest.mark.parametrize("exc", PERMANENT)
def test_permanent_errors_are_4xx_without_retry_after(exc: UnservableError) -> None:
    error = to_api_error(exc, TENANT)
    assert error.status in (400, 422)
    assert "Retry-After" not in error.headers
    assert error.message == str(exc)  # the client's own request: the reason is theirs to read


def test_retry_after_rounds_up_and_is_at_least_one_second() -> None:
    assert to_api_error(QueueFullError("q", 8, 2.1), TENANT).headers["Retry-After"] == "3"
    assert to_api_error(QueueTimeoutError("r", 1.0, 0.0), TENANT).headers["Retry-After"] == "1"
    assert "Retry-After" in to_api_error(CapacityError("x"), TENANT).headers


def test_retry_after_is_capped_at_an_hour_or_a_rate_quotas_own_gap() -> None:
    """An absurd estimate must not become a 300-digit header: an hour at most, except a rate
    quota's wait, which is its own gap (test_ratelimit.py) up to RFC 9111's 2^31 s."""
    full = to_api_error(QueueFullError("the queue", 8, 1e300), TENANT)
    assert full.headers["Retry-After"] == "3600"
    refused = to_api_error(RateLimitError("acme", 1e-300, 1e300), TENANT)
    assert refused.headers["Retry-After"] == str(2**31)
    hourly = to_api_error(RateLimitError("acme", 1 / 7200, 7200.0), TENANT)
    assert hourly.headers["Retry-After"] == "7200"
    owing = to_api_error(RateLimitError("acme", 1.0, 3600.0000001), TENANT)
    assert owing.headers["Retry-After"] == "3600"


def test_a_too_long_prompt_names_the_field_it_came_from() -> None:
    assert to_api_error(PromptTooLongError("2049 tokens"), TENANT).param == "prompt"
    chat = to_api_error(PromptTooLongError("2049 tokens"), TENANT, prompt_param="messages")
    assert chat.param == "messages"
    # ``sampling``'s context rules name their own field (the output budget's, or the prompt)
    budget = ContextLengthError("asks for 600", "max_completion_tokens")
    answer = to_api_error(budget, TENANT, prompt_param="messages")
    assert (answer.status, answer.code, answer.param) == (
        400,
        "context_length_exceeded",
        "max_completion_tokens",
    )


def test_tenant_never_sees_artifact_details_or_internals() -> None:
    load = to_api_error(CorruptArtifactError("/srv/l2/abc/adapter_model.safetensors"), TENANT)
    assert "/srv" not in load.message
    crash = to_api_error(RuntimeError("password=hunter2"), TENANT)
    assert "hunter2" not in crash.message


SECRET_BUGS = [
    (RuntimeError("password=hunter2"), TENANT),
    (RuntimeError("password=hunter2"), ADMIN),
    (ValueError("row 7 of /srv/db: hunter2"), TENANT),  # on the admin API: the operator's input
    (CacheIntegrityError("pins", "hunter2's copy"), TENANT),
    (CacheIntegrityError("pins", "hunter2's copy"), ADMIN),
]


@pytest.mark.parametrize(("exc", "context"), SECRET_BUGS)
def test_internal_errors_name_an_id_that_the_log_explains(
    exc: Exception, context: ErrorContext, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="loraplex.server.errors"):
        error = to_api_error(exc, context)
    assert error.status == 500 and "hunter2" not in error.message
    error_id = error.message.removeprefix("internal error (id ").removesuffix(")")
    assert error_id.startswith("err-") and error_id != error.message
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(logged) == 1 and "hunter2" in logged[0].getMessage()
    assert to_api_error(exc, context).message != error.message  # a fresh id per occurrence


def test_invalid_request_names_its_field() -> None:
    error = to_api_error(InvalidRequestError("cannot render", "messages"), TENANT)
    assert (error.param, error.message) == ("messages", "cannot render")


def test_not_found_names_the_model_parameter() -> None:
    error = to_api_error(AdapterNotFoundError("m"), TENANT)
    assert (error.param, error.type) == ("model", "invalid_request_error")
