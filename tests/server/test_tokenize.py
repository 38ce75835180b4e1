"""vLLM's /tokenize, /detokenize and /version: shapes, tenant scoping, bounds, unknown fields."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Served, make_app_deps
from fakes import BOS, CharTokenizer, FakeEngine
from fastapi.testclient import TestClient

import loraplex
from loraplex.residency.cache import TieredAdapterCache
from loraplex.server.app import create_app
from loraplex.server.chat import ChatMessage

MAX_MODEL_LEN = 64
MAX_PROMPT_CHARS = 120


@pytest.fixture
def client(served: Served) -> Iterator[TestClient]:
    deps = make_app_deps(
        served, FakeEngine(), max_model_len=MAX_MODEL_LEN, max_prompt_chars=MAX_PROMPT_CHARS
    )
    with TestClient(create_app(deps)) as test_client:
        yield test_client
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()


def _auth(served: Served, tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {served.keys[tenant]}"}


def _ids(text: str) -> list[int]:
    return CharTokenizer().encode(text)


def test_tokenize_a_prompt(client: TestClient, served: Served) -> None:
    body = {"model": "support", "prompt": "hi", "return_token_strs": True}
    response = client.post("/tokenize", json=body, headers=_auth(served))
    assert response.status_code == 200, response.text
    assert response.json() == {
        "count": 3,
        "max_model_len": MAX_MODEL_LEN,
        "tokens": [BOS, *_ids("hi")[1:]],
        # a special token as itself, as logprobs show it (it was "", as were all of them)
        "token_strs": [f"<special:{BOS}>", "h", "i"],
    }
    plain = client.post("/tokenize", json={"prompt": "hi"}, headers=_auth(served)).json()
    assert plain["tokens"] == _ids("hi") and plain["token_strs"] is None


def test_tokenize_messages_as_chat_completions_would(client: TestClient, served: Served) -> None:
    deps = client.app.state.deps  # type: ignore[attr-defined]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = {"messages": messages, "add_generation_prompt": True}
    response = client.post("/tokenize", json=body, headers=_auth(served))
    assert response.status_code == 200, response.text
    expected = deps.chat.encode([ChatMessage(**m) for m in messages], deps.engine.tokenizer)
    assert response.json()["tokens"] == expected and response.json()["count"] == len(expected)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
        ({"model": "support"}, "prompt"),
        (
            {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False},
            "add_generation_prompt",
        ),
        ({"prompt": "hi", "add_generation_prompt": True}, "add_generation_prompt"),
        ({"prompt": "hi", "add_special_tokens": False}, "add_special_tokens"),
        (
            {"messages": [{"role": "user", "content": "x"}], "add_special_tokens": True},
            "add_special_tokens",
        ),
        ({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}, "prompt"),
        ({"messages": [{"role": "user", "content": "x" * (MAX_PROMPT_CHARS + 1)}]}, "messages"),
        ({"prompt": "hi", "truncate_prompt_tokens": 3}, "truncate_prompt_tokens"),
        ({"prompt": "hi", "messages": None, "chat_template": "x"}, "chat_template"),
    ],
)
def test_tokenize_refusals_name_the_field(
    client: TestClient, served: Served, body: dict[str, object], param: str
) -> None:
    response = client.post("/tokenize", json=body, headers=_auth(served))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_detokenize_round_trip(client: TestClient, served: Served) -> None:
    tokens = client.post("/tokenize", json={"prompt": "héllo"}, headers=_auth(served)).json()
    body = {"model": "support", "tokens": tokens["tokens"]}
    response = client.post("/detokenize", json=body, headers=_auth(served))
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": "héllo"}


@pytest.mark.parametrize(
    ("tokens", "param"),
    [
        ([BOS, 10**6], "tokens"),  # beyond the vocabulary
        ([BOS, 2**64], "tokens"),  # beyond any integer the tokenizer takes
        ([BOS] * (MAX_MODEL_LEN + 1), "tokens"),  # longer than any sequence here
        ([BOS, -1], "tokens"),
        (["a"], "tokens"),
        ("hi", "tokens"),
    ],
)
def test_detokenize_bounds(client: TestClient, served: Served, tokens: object, param: str) -> None:
    response = client.post("/detokenize", json={"tokens": tokens}, headers=_auth(served))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_unknown_fields_are_refused(client: TestClient, served: Served) -> None:
    response = client.post("/detokenize", json={"tokens": [5], "x": 1}, headers=_auth(served))
    assert response.status_code == 400 and response.json()["error"]["param"] == "x"


def _not_found(client: TestClient, served: Served, route: str, model: str) -> tuple[int, object]:
    body: dict[str, object] = {"model": model}
    body.update({"prompt": "hi"} if route == "/tokenize" else {"tokens": [BOS]})
    response = client.post(route, json=body, headers=_auth(served))
    error = response.json()["error"]
    error["message"] = error["message"].replace(repr(model), "MODEL")
    return response.status_code, error


@pytest.mark.parametrize("route", ["/tokenize", "/detokenize"])
def test_a_foreign_private_model_is_indistinguishable_from_a_missing_one(
    client: TestClient, served: Served, route: str
) -> None:
    foreign = _not_found(client, served, route, "globex/search")
    missing = _not_found(client, served, route, "globex/nothing")
    assert foreign == missing
    assert foreign[0] == 404


@pytest.mark.parametrize("route", ["/tokenize", "/detokenize"])
def test_a_tenant_key_is_required_before_the_body_is_read(
    client: TestClient, served: Served, route: str
) -> None:
    for headers in ({}, {"Authorization": "Bearer lpx_not-a-key"}):
        response = client.post(route, content=b"{not json", headers=headers)
        assert response.status_code == 401, response.text


def test_version_is_public(client: TestClient) -> None:
    response = client.get("/version")
    assert response.status_code == 200
    assert response.json() == {"version": loraplex.__version__}
