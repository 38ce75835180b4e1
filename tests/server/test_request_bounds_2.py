"""Bounds found by a hostile-tenant pass: every list a tenant sends is capped in the schema
(one error, not one per item), chat messages are charged for what the template adds, the model
is resolved before any prompt is rendered or tokenized, and sampling values that would turn
float32 logits into inf or NaN are refused (each a 400 naming its field)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from conftest import Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from pydantic import ValidationError

from loraplex.model.sampler import RowHistory, sample_rows
from loraplex.residency.cache import TieredAdapterCache
from loraplex.sampling import SamplingParams
from loraplex.server.app import create_app
from loraplex.server.chat import MESSAGE_OVERHEAD_CHARS, ChatMessage, num_prompt_chars
from loraplex.server.choices import DEFAULT_MAX_CHOICES
from loraplex.server.deps import ServerDeps
from loraplex.server.protocol import (
    MAX_BATCH_PROMPTS,
    MAX_CHAT_MESSAGES,
    MAX_CONTENT_PARTS,
    MAX_TOKEN_IDS,
    CompletionRequest,
    DetokenizeRequest,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_PROMPT_CHARS = 100


@dataclass
class Counted:
    """A test client whose chat template and tokenizer count their calls."""

    client: TestClient
    deps: ServerDeps
    engine: FakeEngine
    served: Served
    calls: list[str]  # "render" / "encode", in call order

    def post(self, path: str, tenant: str = "acme", **body: Any) -> Any:
        auth = {"Authorization": f"Bearer {self.served.keys[tenant]}"}
        return self.client.post(path, json=body, headers=auth)


@pytest.fixture
def counted(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    engine = FakeEngine()
    deps = make_app_deps(served, engine, max_prompt_chars=MAX_PROMPT_CHARS)
    assert deps.chat is not None
    calls: list[str] = []
    render, encode = deps.chat.render, engine.char_tokenizer.encode

    def counted_render(messages: Any, reasoning_effort: str | None = None) -> str:
        calls.append("render")
        return render(messages, reasoning_effort)

    def counted_encode(text: str) -> list[int]:
        calls.append("encode")
        return encode(text)

    monkeypatch.setattr(deps.chat, "render", counted_render)
    monkeypatch.setattr(engine.char_tokenizer, "encode", counted_encode)
    with TestClient(create_app(deps)) as client:
        yield Counted(client, deps, engine, served, calls)
    assert isinstance(deps.cache, TieredAdapterCache)
    deps.cache.close()


def _error(reply: Any) -> dict[str, Any]:
    assert reply.status_code == 400, reply.text
    error: dict[str, Any] = reply.json()["error"]
    return error


# ---- chat messages ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
def test_too_many_messages_are_refused_before_the_template_runs(
    counted: Counted, path: str
) -> None:
    messages = [{"role": "user"}] * (MAX_CHAT_MESSAGES + 1)
    error = _error(counted.post(path, model="support", messages=messages))
    assert error["param"] == "messages" and str(MAX_CHAT_MESSAGES) in error["message"]
    assert counted.calls == [] and counted.engine.requests == []


def test_each_message_is_charged_its_role_name_content_and_the_template_overhead() -> None:
    plain = ChatMessage("user", "x" * 10)
    named = ChatMessage("assistant", "", name="bob")
    assert num_prompt_chars([plain]) == 4 + 10 + MESSAGE_OVERHEAD_CHARS
    assert num_prompt_chars([plain, named]) == 14 + 9 + 3 + 2 * MESSAGE_OVERHEAD_CHARS


@pytest.mark.parametrize("path", [CHAT, "/tokenize"])
def test_empty_messages_add_up_to_the_prompt_character_cap(counted: Counted, path: str) -> None:
    per_message = len("user") + MESSAGE_OVERHEAD_CHARS
    fits = [{"role": "user", "content": ""}] * (MAX_PROMPT_CHARS // per_message)
    assert counted.post(path, model="support", messages=fits).status_code == 200
    assert counted.calls[:1] == ["render"]
    counted.calls.clear()
    too_many = [*fits, {"role": "user", "content": ""}]
    error = _error(counted.post(path, model="support", messages=too_many))
    assert error["param"] == "messages" and f"at most {MAX_PROMPT_CHARS}" in error["message"]
    assert counted.calls == []


def test_a_name_counts_towards_the_cap(counted: Counted) -> None:
    content = "x" * (MAX_PROMPT_CHARS - len("user") - MESSAGE_OVERHEAD_CHARS)
    fits = [{"role": "user", "content": content}]
    assert counted.post(CHAT, model="support", messages=fits).status_code == 200
    named = [{"role": "user", "content": content, "name": "b"}]
    assert _error(counted.post(CHAT, model="support", messages=named))["param"] == "messages"


def test_content_parts_per_message_are_capped(counted: Counted) -> None:
    parts = [{"type": "text", "text": "x"}] * (MAX_CONTENT_PARTS + 1)
    error = _error(
        counted.post(CHAT, model="support", messages=[{"role": "user", "content": parts}])
    )
    assert error["param"] == "messages.0.content" and "text parts" in error["message"]
    assert counted.calls == []


# ---- the model is resolved before anything is encoded -------------------------------------------

_PROMPTS: dict[str, dict[str, Any]] = {
    CHAT: {"messages": [{"role": "user", "content": "hi"}]},
    COMPLETIONS: {"prompt": "hi"},
    "/tokenize": {"messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("path", list(_PROMPTS))
def test_an_unusable_model_is_a_404_before_the_prompt_is_encoded(
    counted: Counted, path: str
) -> None:
    refused = counted.post(path, model="globex/search", **_PROMPTS[path])
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert counted.calls == []
    allowed = counted.post(path, model="support", **_PROMPTS[path])
    assert allowed.status_code == 200, allowed.text
    assert "encode" in counted.calls  # the same body is encoded once the model is usable


# ---- lists are capped in the schema -------------------------------------------------------------

_TOO_LONG = [
    (COMPLETIONS, {"prompt": ["x"] * (MAX_BATCH_PROMPTS + 1)}, "prompt", "17 prompts"),
    (COMPLETIONS, {"prompt": [[5]] * (MAX_BATCH_PROMPTS + 1)}, "prompt", "17 prompts"),
    (COMPLETIONS, {"prompt": [5] * (MAX_TOKEN_IDS + 1)}, "prompt", "token ids"),
    (COMPLETIONS, {"prompt": [[5] * (MAX_TOKEN_IDS + 1)]}, "prompt", "token ids"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(301)}},
     "logit_bias", "300"),
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": list(range(65))}, "stop_token_ids", "64"),
    (COMPLETIONS, {"prompt": "hi", "stop": ["a"] * 5}, "stop", "5 stop strings"),
    ("/detokenize", {"tokens": [5] * (MAX_TOKEN_IDS + 1)}, "tokens", "token ids"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param", "said"), _TOO_LONG)
def test_a_list_past_its_cap_is_a_400_naming_the_field(
    counted: Counted, path: str, body: dict[str, Any], param: str, said: str
) -> None:
    error = _error(counted.post(path, model="support", **body))
    assert error["param"] == param and said in error["message"]
    assert counted.calls == [] and counted.engine.requests == []


def test_a_batch_of_prompts_is_capped_at_the_fan_out_limit() -> None:
    assert MAX_BATCH_PROMPTS == DEFAULT_MAX_CHOICES  # more prompts could never be served


def test_many_wrong_items_make_one_error_not_one_per_item() -> None:
    """Pydantic reports every wrong item of a list under its cap: 16 x 65,536 strings where ids
    belong built a million errors (seconds on the event loop)."""
    wrong = [["x"] * MAX_TOKEN_IDS] * MAX_BATCH_PROMPTS
    with pytest.raises(ValidationError) as refused:
        CompletionRequest.model_validate({"model": "m", "prompt": wrong})
    assert refused.value.error_count() <= 2 * (MAX_BATCH_PROMPTS + 4)
    with pytest.raises(ValidationError) as refused:
        DetokenizeRequest.model_validate({"tokens": ["x"] * MAX_TOKEN_IDS})
    assert refused.value.error_count() == 1


# ---- ids are strict integers --------------------------------------------------------------------

_NOT_IDS = [
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": ["5"]}, "stop_token_ids"),
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": [5.0]}, "stop_token_ids"),
    (COMPLETIONS, {"prompt": [5, "6"]}, "prompt"),
    (COMPLETIONS, {"prompt": [5, True]}, "prompt"),
    (COMPLETIONS, {"prompt": [[5], [6.0]]}, "prompt"),
    ("/detokenize", {"tokens": ["5"]}, "tokens"),
    ("/detokenize", {"tokens": [True]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"1" * 5000: 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"1" * 11: 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"+5": 1}}, "logit_bias"),
]


@pytest.mark.parametrize(("path", "body", "param"), _NOT_IDS)
def test_a_token_id_must_be_a_plain_integer(
    counted: Counted, path: str, body: dict[str, Any], param: str
) -> None:
    error = _error(counted.post(path, model="support", **body))
    assert error["param"].split(".")[0] == param, error
    assert "Exceeds the limit" not in error["message"]  # Python's own words, naming nothing
    assert counted.calls == [] and counted.engine.requests == []


def test_a_logit_bias_key_of_ten_digits_is_still_a_token_id_checked_against_the_vocabulary(
    counted: Counted,
) -> None:
    error = _error(counted.post(COMPLETIONS, model="support", prompt="hi",
                                logit_bias={"9" * 10: 1}))  # fmt: skip
    assert error["param"] == "logit_bias" and "9999999999" in error["message"]


# ---- values that overflow float32 logits --------------------------------------------------------


@pytest.mark.parametrize("value", [1e-300, 0.0099, 100.5, 1e300])
def test_a_repetition_penalty_outside_its_range_is_a_400(counted: Counted, value: float) -> None:
    error = _error(
        counted.post(COMPLETIONS, model="support", prompt="hi", repetition_penalty=value)
    )
    assert error["param"] == "repetition_penalty"
    assert counted.engine.requests == []


@pytest.mark.parametrize("value", [0.01, 100.0])
def test_a_repetition_penalty_at_its_bounds_reaches_the_engine(
    counted: Counted, value: float
) -> None:
    reply = counted.post(COMPLETIONS, model="support", prompt="hi", repetition_penalty=value)
    assert reply.status_code == 200, reply.text
    assert counted.engine.requests[-1].params.repetition_penalty == value


@pytest.mark.parametrize(
    ("field", "value"),
    [("repetition_penalty", 1e-300), ("repetition_penalty", 101.0), ("temperature", float("inf"))],
)
def test_sampling_params_refuse_values_that_overflow(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("penalty", [0.01, 100.0])
@pytest.mark.parametrize("temperature", [0.0, 1e-5])
def test_every_value_at_its_bound_keeps_the_logits_finite(
    penalty: float, temperature: float
) -> None:
    """The bounds together: the largest bias and penalties, the smallest temperature that still
    samples, and min_p at 1, on logits far beyond what a model produces."""
    vocab = 64
    logits = torch.linspace(-1e4, 1e4, vocab).unsqueeze(0)
    bias = tuple((t, 100.0 if t % 2 else -100.0) for t in range(0, vocab, 3))
    params = SamplingParams(temperature=temperature, repetition_penalty=penalty, min_p=1.0,
                            presence_penalty=-2.0, frequency_penalty=2.0, logit_bias=bias,
                            seed=0)  # fmt: skip
    history = RowHistory(prompt=tuple(range(vocab)), output=(vocab - 1, vocab - 1))
    generator = torch.Generator().manual_seed(0) if not params.greedy else None
    out = sample_rows(logits, [params], [generator], histories=[history])
    assert out.failures == {} and 0 <= out.tokens[0] < vocab
