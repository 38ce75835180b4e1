"""The OpenAI-compatible routes over a scripted engine: resolution, shapes, streaming, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import BASE_NAME, Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient

from loraplex.errors import (
    AdapterTooLargeError,
    CacheIntegrityError,
    CorruptArtifactError,
    EngineUnavailableError,
    GenerationError,
    NoAdapterCacheError,
    PromptTooLongError,
    QueueFullError,
    QueueTimeoutError,
)
from loraplex.residency.ledger import Tier
from loraplex.server.app import create_app
from loraplex.server.chat import ChatMessage

NOT_FOUND = "model {!r} does not name an adapter available to you"


def _post(rig: Rig, tenant: str, path: str, **body: Any) -> Any:
    return rig.client.post(path, json=body, headers=rig.headers(tenant))


def _events(text: str) -> list[Any]:
    lines = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(
    ("model", "revision"),
    [
        ("support", "acme/support@r1"),
        ("acme/support", "acme/support@r1"),
        ("support@r2", "acme/support@r2"),
        ("acme/billing@r1", "acme/billing@r1"),
    ],
)
def test_completion_reports_the_revision_that_answered(rig: Rig, model: str, revision: str) -> None:
    response = _post(rig, "acme", "/v1/completions", model=model, prompt="hi", max_tokens=8)
    assert response.status_code == 200
    body = response.json()
    assert response.headers["x-loraplex-revision"] == revision
    assert body["loraplex"]["revision"] == revision
    assert body["model"] == model
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == f" {revision} answers."
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    sent = rig.engine.requests[-1]
    assert sent.tenant == "acme" and sent.adapter_key is not None
    assert sent.adapter_key.ref == revision
    assert body["loraplex"]["adapter_digest"] == sent.adapter_key.adapter_digest


def test_base_model_answers_without_an_adapter(rig: Rig) -> None:
    response = _post(rig, "globex", "/v1/completions", model=BASE_NAME, prompt="x")
    assert response.status_code == 200
    assert response.json()["loraplex"] == {"revision": None, "adapter_digest": None, "tier": None}
    assert response.headers["x-loraplex-revision"] == BASE_NAME
    assert rig.engine.requests[-1].adapter_key is None


def test_sampling_fields_reach_the_engine(rig: Rig) -> None:
    _post(
        rig, "acme", "/v1/completions", model="support", prompt=[1, 70, 71], max_tokens=1,
        temperature=0.5, top_p=0.9, seed=7, stop=["zz"],
    )  # fmt: skip
    sent = rig.engine.requests[-1]
    assert sent.prompt_token_ids == (1, 70, 71)
    params = sent.params
    assert (params.max_tokens, params.temperature, params.top_p, params.seed, params.stop) == (
        1, 0.5, 0.9, 7, ("zz",)
    )  # fmt: skip


def test_the_engine_finish_reason_reaches_the_choice(rig: Rig) -> None:
    short = _post(rig, "acme", "/v1/completions", model="support", prompt="a", max_tokens=1)
    assert short.json()["choices"][0] == {
        "index": 0, "text": " acme/support@r1", "logprobs": None, "finish_reason": "length",
        "stop_reason": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 17), ("temperature", -1), ("top_p", 0), ("max_tokens", 0), ("stop", ["a"] * 5),
     ("prompt", ["a"] * 17), ("prompt", []), ("prompt", [1, 10**9])],
)  # fmt: skip
def test_bad_fields_get_400_and_reach_no_engine(rig: Rig, field: str, value: object) -> None:
    body: dict[str, object] = {"model": "support", "prompt": "hi", field: value}
    response = rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert rig.engine.requests == []


def test_streaming_completion(rig: Rig) -> None:
    response = _post(
        rig, "acme", "/v1/completions", model="legal", prompt="hi", stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-loraplex-revision"] == "acme/legal@r1"
    chunks = _events(response.text)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(texts) == " acme/legal@r1 answers."
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]] == [None, "stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    assert {c["loraplex"]["revision"] for c in chunks} == {"acme/legal@r1"}
    assert len({c["id"] for c in chunks}) == 1


def test_chat_prompt_is_the_rendered_template(rig: Rig) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    response = _post(rig, "globex", "/v1/chat/completions", model="search", messages=messages)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    # refusal: required (null) in OpenAI's response message, sent by vLLM; it was left out
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": " globex/search@r1 answers.",
        "refusal": None,
    }
    template = rig.client.app.state.deps.chat  # type: ignore[attr-defined]
    sent = [ChatMessage("system", "be brief"), ChatMessage("user", "hello")]
    expected = template.encode(sent, rig.engine.tokenizer)
    assert list(rig.engine.requests[-1].prompt_token_ids) == expected


def test_streaming_chat_announces_the_role_then_content(rig: Rig) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    response = _post(
        rig, "initech", "/v1/chat/completions", model="chat", messages=messages, stream=True
    )
    chunks = _events(response.text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # As OpenAI and vLLM: only the first delta names the role; later ones leave it out (not null).
    later = [c["choices"][0]["delta"] for c in chunks[1:] if c["choices"]]
    assert later and all("role" not in delta for delta in later)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == " initech/chat@r1 answers."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def _not_found_body(rig: Rig, tenant: str, model: str) -> tuple[int, dict[str, Any]]:
    response = _post(rig, tenant, "/v1/completions", model=model, prompt="hi")
    body = response.json()
    body["error"]["message"] = body["error"]["message"].replace(repr(model), "MODEL")
    return response.status_code, body


@pytest.mark.parametrize(
    "foreign", ["globex/search", "globex/search@r2", "search", "initech/review@r1"]
)
def test_foreign_private_adapter_is_indistinguishable_from_a_missing_one(
    rig: Rig, foreign: str
) -> None:
    assert _not_found_body(rig, "acme", foreign) == _not_found_body(rig, "acme", "globex/nothing")
    status, body = _not_found_body(rig, "acme", foreign)
    assert status == 404 and body["error"]["code"] == "model_not_found"
    detail = rig.client.get(f"/v1/models/{foreign}", headers=rig.headers("acme"))
    missing = rig.client.get("/v1/models/globex/nothing", headers=rig.headers("acme"))
    assert detail.status_code == missing.status_code == 404
    assert rig.engine.requests == []


@pytest.mark.parametrize("model", ["/etc/passwd", "../acme/support", "file:///tmp/x", "http://h/a"])
def test_paths_and_urls_are_just_unknown_names(rig: Rig, model: str) -> None:
    status, body = _not_found_body(rig, "acme", model)
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_models_lists_only_the_callers_adapters(rig: Rig) -> None:
    # The base model's ``created`` is when the server was built (a client may sort or show it).
    started = rig.client.app.state.deps.started_at_s  # type: ignore[attr-defined]
    assert started > 1_700_000_000
    for tenant in ("acme", "globex", "initech"):
        data = rig.client.get("/v1/models", headers=rig.headers(tenant)).json()["data"]
        assert data[0] == {
            "id": BASE_NAME, "object": "model", "created": started, "owned_by": "loraplex",
            "root": BASE_NAME, "parent": None, "max_model_len": None, "signed": None,
        }  # fmt: skip
        adapters = data[1:]
        own = {a.name for a in rig.served.assets.adapters if a.tenant == tenant}
        assert {a["id"] for a in adapters} == own
        assert {a["owned_by"] for a in adapters} == {tenant}
        assert {a["parent"] for a in adapters} == {BASE_NAME}
        assert {a["root"] for a in adapters} == {f"{tenant}/{name}" for name in own}
        assert {a["signed"] for a in adapters} == {False}  # the demo set is unsigned
    card = rig.client.get("/v1/models/support", headers=rig.headers("acme")).json()
    assert (card["id"], card["root"]) == ("support", "acme/support")


def test_one_model_card_reads_that_adapters_signing_only(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /v1/models/{model} read every adapter of the caller's (all its revisions and
    aliases) for one card's ``signed``: a cost per request growing with the tenant's catalogue."""
    registry = rig.client.app.state.deps.registry  # type: ignore[attr-defined]
    asked: list[object] = []
    original = registry.signed_adapters

    def spy(tenant: str, names: Any = None) -> dict[str, bool]:
        asked.append(None if names is None else list(names))
        return original(tenant, names)

    monkeypatch.setattr(registry, "signed_adapters", spy)
    card = rig.client.get("/v1/models/support", headers=rig.headers("acme")).json()
    assert (card["id"], card["signed"]) == ("support", False)
    assert asked == [["support"]]


@pytest.mark.parametrize(
    ("exc", "status", "retry_after"),
    [
        (QueueTimeoutError("x", 30.0, 2.0), 503, "2"),
        (QueueFullError("tenant acme's queue", 4, 0.5), 429, "1"),
        (CorruptArtifactError("disk copy corrupt"), 500, None),
        (PromptTooLongError("the prompt has 600 tokens"), 400, None),
        (NoAdapterCacheError("this engine serves the base model only"), 400, None),
        (AdapterTooLargeError("the adapter needs 9 GB; L0 holds 1 GB"), 422, None),
        (ValueError("deep in the engine"), 500, None),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_engine_errors_before_the_first_token_get_a_status(
    rig: Rig, exc: Exception, status: int, retry_after: str | None, stream: bool
) -> None:
    rig.engine.errors["acme/triage@r1"] = exc
    response = _post(rig, "acme", "/v1/completions", model="triage", prompt="hi", stream=stream)
    assert response.status_code == status
    assert response.headers.get("retry-after") == retry_after
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


MID_STREAM = [
    (QueueTimeoutError("x", 1.0, 1.0), "queue_timeout"),
    (GenerationError("r1", "non-finite logits"), "generation_failed"),
    (PromptTooLongError("too long"), "context_length_exceeded"),
    (CacheIntegrityError("pins", "the secret"), "internal_error"),
    (ValueError("the secret"), "internal_error"),
    (KeyError("the secret"), "internal_error"),
]


@pytest.mark.parametrize(("exc", "code"), MID_STREAM)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_any_error_after_the_first_token_ends_the_stream_with_an_error_event(
    rig: Rig, exc: Exception, code: str, path: str
) -> None:
    rig.engine.mid_stream_errors["acme/triage@r1"] = exc
    chat = path == "/v1/chat/completions"
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    )
    response = _post(rig, "acme", path, model="triage", stream=True, **prompt)
    assert response.status_code == 200
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert "[DONE]" not in lines  # a client must not mistake the cut stream for a whole one
    choice = json.loads(lines[-2])["choices"][0]  # the first token went out before the error
    assert (choice["delta"]["content"] if chat else choice["text"]) == " acme/triage@r1"
    error = json.loads(lines[-1])["error"]
    assert error["code"] == code
    assert "secret" not in response.text


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_cut_by_its_engine_gives_the_usage_forwarded_before_the_error(
    rig: Rig, include_usage: bool, path: str
) -> None:
    """An engine (a fleet's replica) lost after the first token: with ``include_usage`` the
    tokens forwarded so far are given in a usage event just before the error event (before,
    none: the client could not tell what it was counted); without it, no usage, as vLLM."""
    lost = EngineUnavailableError("the engine replica serving request x was lost")
    rig.engine.mid_stream_errors["acme/triage@r1"] = lost
    chat = path == "/v1/chat/completions"
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    )
    options = {"include_usage": include_usage}
    response = _post(rig, "acme", path, model="triage", stream=True, stream_options=options,
                     max_tokens=8, **prompt)  # fmt: skip
    lines = [
        json.loads(line.removeprefix("data: ")) for line in response.text.split("\n\n") if line
    ]
    assert lines[-1]["error"]["code"] == "engine_unavailable"
    usages = [line["usage"] for line in lines[:-1] if line.get("usage")]
    if not include_usage:
        assert usages == []
        return
    assert lines[-2]["choices"] == [] and usages == [lines[-2]["usage"]]  # just before the error
    num_prompt = len(rig.engine.requests[-1].prompt_token_ids)
    assert usages[0] == {"prompt_tokens": num_prompt, "completion_tokens": 1,
                         "total_tokens": num_prompt + 1}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_the_tier_reported_is_where_the_engine_found_the_adapter(rig: Rig, stream: bool) -> None:
    arrival = _post(rig, "acme", "/v1/completions", model="support", prompt="hi", max_tokens=4)
    assert arrival.headers["x-loraplex-tier"] == "L3"  # the cache holds no copy on arrival
    rig.engine.leased_from = Tier.L0  # e.g. a prefetch finished before the engine asked for it
    reply = _post(rig, "acme", "/v1/completions", model="support", prompt="hi", max_tokens=4,
                  stream=stream)  # fmt: skip
    assert reply.headers["x-loraplex-tier"] == "L0"
    bodies = _events(reply.text) if stream else [reply.json()]
    assert {b["loraplex"]["tier"] for b in bodies} == {"L0"}
    scrape = rig.client.get("/metrics", headers=rig.admin).text
    warm = 'request_ttft_seconds_count{cold="false",priority_class="normal"} 1.0'
    assert warm in scrape  # the metrics follow the engine's word too


def test_an_unexpected_error_mid_stream_is_an_error_event_that_reveals_nothing(rig: Rig) -> None:
    rig.engine.mid_stream_errors["acme/triage@r1"] = RuntimeError("another tenant's secret")
    response = _post(rig, "acme", "/v1/completions", model="triage", prompt="hi", stream=True)
    last = json.loads(
        [line for line in response.text.split("\n\n") if line][-1].removeprefix("data: ")
    )
    assert last["error"]["code"] == "internal_error"
    assert last["error"]["message"].startswith("internal error (id err-")
    assert "secret" not in response.text


def test_a_prompt_longer_than_the_context_is_a_permanent_400(served: Served) -> None:
    engine = FakeEngine()
    deps = make_app_deps(served, engine, max_prompt_tokens=4)
    try:
        with TestClient(create_app(deps)) as client:
            reply = client.post(
                "/v1/completions",
                json={"model": "support", "prompt": "five!"},  # BOS + 5 characters: 6 tokens
                headers={"Authorization": f"Bearer {served.keys['acme']}"},
            )
    finally:
        assert deps.cache is not None
        deps.cache.close()
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert reply.json()["error"]["param"] == "prompt"
    assert "retry-after" not in reply.headers
    assert engine.requests == []


def test_revision_and_prompt_ids_take_one_trip_to_the_thread_pool(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trip wakes a worker and hands back to the loop (docs/benchmarks/peer.md, "The
    loraplex side's tail"): resolving and tokenizing share one."""
    import loraplex.server.serving as serving

    trips: list[str] = []
    real = serving.run_in_threadpool

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(func.__name__)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(serving, "run_in_threadpool", counted)
    for prompt in ("The acme support team", [1, 70, 71]):
        trips.clear()
        response = _post(rig, "acme", "/v1/completions", model="support", prompt=prompt)
        assert response.status_code == 200
        assert trips == ["both"]
        assert rig.engine.requests[-1].adapter_key is not None
    assert rig.engine.requests[-1].prompt_token_ids == (1, 70, 71)


def test_a_model_that_does_not_resolve_is_never_tokenized(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loraplex.server.prompts as prompts

    encoded: list[object] = []
    real = prompts._prompt_ids
    monkeypatch.setattr(prompts, "_prompt_ids", lambda deps, p: encoded.append(p) or real(deps, p))
    response = _post(rig, "acme", "/v1/completions", model="nope", prompt="some text")
    assert response.status_code == 404 and encoded == []
    assert _post(rig, "acme", "/v1/completions", model="support", prompt="x").status_code == 200
    assert encoded == ["x"]
