"""The one error mapping: statuses, OpenAI error bodies and Retry-After."""

from __future__ import annotations

import pytest

from loraplex.errors import (
    AdapterNotFoundError,
    AuthenticationError,
    CapacityError,
    CorruptArtifactError,
    DigestMismatchError,
    EngineUnavailableError,
    GenerationError,
    LoadCancelledError,
    PathOutsideStoreError,
    QueueFullError,
    QueueTimeoutError,
    RateLimitError,
    RegistryError,
    RevisionConflictError,
    TensorValidationError,
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
        (RateLimitError("acme", 2.0, 0.5), TENANT, 429, "rate_limited"),
        (GenerationError("r1", "non-finite logits"), TENANT, 422, "generation_failed"),
        (CorruptArtifactError("bad"), TENANT, 500, "adapter_load_failed"),
        (DigestMismatchError("w", "a", "b"), TENANT, 500, "adapter_load_failed"),
        (LoadCancelledError("gone"), TENANT, 500, "adapter_load_failed"),
        (TensorValidationError("bad shape"), ADMIN, 422, "invalid_adapter"),
        (RevisionConflictError("differs"), ADMIN, 409, "revision_conflict"),
        (PathOutsideStoreError("../x"), ADMIN, 400, "invalid_request"),
        (RegistryError("tenant exists"), ADMIN, 400, "invalid_request"),
        (ValueError("max_tokens 0 is invalid"), TENANT, 400, "invalid_request"),
        (RuntimeError("secret internals"), TENANT, 500, "internal_error"),
    ],
)  # fmt: skip
def test_mapping(exc: Exception, context: ErrorContext, status: int, code: str) -> None:
    error = to_api_error(exc, context)
    assert (error.status, error.code) == (status, code)
    body = error.body()["error"]
    assert isinstance(body, dict)
    assert set(body) == {"message", "type", "param", "code"}


def test_retry_after_rounds_up_and_is_at_least_one_second() -> None:
    assert to_api_error(QueueFullError("q", 8, 2.1), TENANT).headers["Retry-After"] == "3"
    assert to_api_error(QueueTimeoutError("r", 1.0, 0.0), TENANT).headers["Retry-After"] == "1"
    assert "Retry-After" in to_api_error(CapacityError("x"), TENANT).headers


def test_tenant_never_sees_artifact_details_or_internals() -> None:
    load = to_api_error(CorruptArtifactError("/srv/l2/abc/adapter_model.safetensors"), TENANT)
    assert "/srv" not in load.message
    crash = to_api_error(RuntimeError("password=hunter2"), TENANT)
    assert "hunter2" not in crash.message


def test_not_found_names_the_model_parameter() -> None:
    error = to_api_error(AdapterNotFoundError("m"), TENANT)
    assert (error.param, error.type) == ("model", "invalid_request_error")
