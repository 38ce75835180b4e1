"""vLLM's request extensions, refused OpenAI fields, and the tier reported on arrival."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import BASE_NAME, Rig

from loraplex.artifacts.identity import AdapterKey
from loraplex.residency.ledger import Tier

TIER_HEADER = "x-loraplex-tier"


def _post(rig: Rig, tenant: str, path: str, **body: Any) -> Any:
    return rig.client.post(path, json=body, headers=rig.headers(tenant))


def _key(rig: Rig, tenant: str, model: str) -> AdapterKey:
    return rig.served.registry.resolve(tenant, model)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_ignore_eos_and_min_tokens_reach_the_engine(rig: Rig, path: str) -> None:
    prompt: dict[str, Any] = (
        {"prompt": "hi"} if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "hi"}]}
    )  # fmt: skip
    body = {"model": "support", "max_tokens": 9, "ignore_eos": True, "min_tokens": 4, **prompt}
    assert _post(rig, "acme", path, **body).status_code == 200
    params = rig.engine.requests[-1].params
    assert params.ignore_eos and params.min_tokens == 4 and params.max_tokens == 9


def test_defaults_keep_eos_and_no_minimum(rig: Rig) -> None:
    assert _post(rig, "acme", "/v1/completions", model="support", prompt="hi").status_code == 200
    params = rig.engine.requests[-1].params
    assert not params.ignore_eos and params.min_tokens == 0


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("n", 17, "n"),
        ("logprobs", 21, "logprobs"),
        ("logprobs", -1, "logprobs"),
        ("logprobs", True, "logprobs"),
        ("top_logprobs", 3, "top_logprobs"),
        ("min_tokens", 20, None),  # above max_tokens
        ("min_tokens", -1, "min_tokens"),
    ],
)
def test_unsupported_values_get_a_400_in_openai_shape(
    rig: Rig, field: str, value: object, param: str | None
) -> None:
    before = len(rig.engine.requests)
    body = {"model": "support", "prompt": "hi", "max_tokens": 8, field: value}
    response = _post(rig, "acme", "/v1/completions", **body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"]
    if param is not None:
        assert error["param"] == param
    assert len(rig.engine.requests) == before  # nothing reached the engine


@pytest.mark.parametrize("value", [None, False])
def test_logprobs_off_is_accepted(rig: Rig, value: bool | None) -> None:
    body = {"model": "support", "messages": [{"role": "user", "content": "hi"}], "logprobs": value}
    assert _post(rig, "acme", "/v1/chat/completions", **body).status_code == 200


def test_tier_follows_the_cache_on_arrival(rig: Rig) -> None:
    key = _key(rig, "acme", "support")
    body = {"model": "support", "prompt": "hi", "max_tokens": 8}
    cold = _post(rig, "acme", "/v1/completions", **body)
    assert cold.json()["loraplex"]["tier"] == "L3" and cold.headers[TIER_HEADER] == "L3"
    rig.cache.prefetch(key, Tier.L1).result(timeout=10)
    rig.cache.check_integrity()
    warm = _post(rig, "acme", "/v1/completions", **body)
    assert warm.json()["loraplex"]["tier"] == "L1" and warm.headers[TIER_HEADER] == "L1"
    rig.engine.running = (key,)
    hot = _post(rig, "acme", "/v1/completions", **body)
    assert hot.json()["loraplex"]["tier"] == "L0" and hot.headers[TIER_HEADER] == "L0"


def test_streamed_chunks_carry_the_tier(rig: Rig) -> None:
    rig.engine.running = (_key(rig, "acme", "support"),)
    body = {"model": "support", "prompt": "hi", "max_tokens": 8, "stream": True}
    response = _post(rig, "acme", "/v1/completions", **body)
    assert response.headers[TIER_HEADER] == "L0"
    lines = [x.removeprefix("data: ") for x in response.text.split("\n\n") if x]
    chunks = [json.loads(x) for x in lines[:-1]]
    assert chunks and {c["loraplex"]["tier"] for c in chunks} == {"L0"}


def test_base_model_has_no_tier(rig: Rig) -> None:
    response = _post(rig, "acme", "/v1/completions", model=BASE_NAME, prompt="hi")
    assert response.json()["loraplex"]["tier"] is None
    assert TIER_HEADER not in response.headers
