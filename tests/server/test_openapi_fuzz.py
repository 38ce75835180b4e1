"""Schema-driven fuzzing of the tenant API: schemathesis generates requests from the public
/openapi.json for every operation in it and sends them, with a tenant key, to the app on the fake
engine. No answer may be a 5xx, and every answer must match the document (status, content type,
body schema). ``model`` is steered half of the time to names that exist (own, pinned, foreign,
base) and ``tokens`` to ids inside the vocabulary, so that requests get past the registry's 404
and the bounds and reach the engine and the tokenizer.

Bounded: ``MAX_EXAMPLES`` per operation, derandomized (the same requests on every run)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from conftest import BASE_NAME, Served, make_app_deps
from fakes import FakeEngine
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from loraplex.residency.cache import TieredAdapterCache
from loraplex.server.app import create_app

MAX_EXAMPLES = 20  # per operation
MODELS = (BASE_NAME, "support", "support@r1", "acme/support@r2", "globex/search", "no/such@x")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
TENANT_OPERATIONS = {
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "GET /v1/models",
    "GET /v1/models/{model}",
    "POST /tokenize",
    "POST /detokenize",
    "GET /version",
}


@pytest.fixture
def app(served: Served) -> Iterator[FastAPI]:
    deps = make_app_deps(served, FakeEngine(), max_model_len=256)
    yield create_app(deps)
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()


def _aim(case: schemathesis.Case[Any], steer: dict[str, Any]) -> None:
    """Replaces the generated ``model`` and ``tokens`` with the steered ones, where the case has
    them and a steered value was drawn (None: the generated value stays)."""
    for name, value in steer.items():
        if value is None:
            continue
        if isinstance(case.body, dict) and name in case.body:
            case.body[name] = value
        if case.path_parameters and name in case.path_parameters:
            case.path_parameters[name] = value


def _fuzz(operation: Any, headers: dict[str, str], vocab_size: int) -> None:
    steer = st.fixed_dictionaries(
        {
            "model": st.none() | st.sampled_from(MODELS),
            "tokens": st.none() | st.lists(st.integers(0, vocab_size - 1), max_size=40),
        }
    )

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=operation.as_strategy(), steered=steer)
    def run(case: schemathesis.Case[Any], steered: dict[str, Any]) -> None:
        _aim(case, steered)
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()


def test_the_tenant_api_never_answers_5xx(app: FastAPI, served: Served) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    labels = {f"{op.method.upper()} {op.path}" for op in operations}
    assert labels >= TENANT_OPERATIONS
    assert not any("/admin" in label or "lora_adapter" in label for label in labels)
    headers = {"Authorization": f"Bearer {served.keys['acme']}"}
    vocab_size = app.state.deps.config.vocab_size
    for operation in operations:
        _fuzz(operation, headers, vocab_size)
    engine: FakeEngine = app.state.deps.engine
    assert engine.requests, "no generated request got past validation to the engine"
