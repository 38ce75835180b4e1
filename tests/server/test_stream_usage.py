"""``stream_options.continuous_usage_stats`` as vLLM defines it: with ``include_usage``, every
chunk of a choice carries that choice's usage so far (its prompt's tokens, what it generated up
to that chunk); chat's role chunks carry 0 generated; the final usage chunk still sums every
choice; without ``include_usage`` it changes nothing. GuideLLM sends it on every request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import Rig

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _stream(rig: Rig, path: str, **fields: Any) -> list[dict[str, Any]]:
    prompt: dict[str, Any] = (
        {"prompt": "hi"}
        if path == COMPLETIONS
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    body = {"model": "support", "stream": True, **prompt, **fields}
    reply = rig.client.post(path, json=body, headers=rig.headers("acme"))
    assert reply.status_code == 200, reply.text
    lines = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _generated(choice: dict[str, Any], chat: bool) -> bool:
    """Whether the chunk shows a generated token (chat's role chunk does not)."""
    return not (chat and choice["delta"].get("role") == "assistant")


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("n", [1, 3])
def test_every_chunk_carries_its_choices_usage_so_far(rig: Rig, path: str, n: int) -> None:
    chunks = _stream(rig, path, n=n, stream_options=CONTINUOUS)
    prompt = len(rig.engine.requests[-1].prompt_token_ids)
    *choice_chunks, final = chunks
    assert final["choices"] == []
    counts = dict.fromkeys(range(n), 0)
    for chunk in choice_chunks:
        (choice,) = chunk["choices"]
        if _generated(choice, path == CHAT):
            counts[choice["index"]] += 1  # the fake engine sends one token per delta
        assert chunk["usage"] == _usage(prompt, counts[choice["index"]]), chunk
    assert all(count > 1 for count in counts.values())
    assert final["usage"] == _usage(prompt, sum(counts.values()))  # each prompt once


def test_a_batch_of_prompts_counts_each_choices_own_prompt(rig: Rig) -> None:
    chunks = _stream(rig, COMPLETIONS, prompt=[[1, 2], [1, 2, 3, 4, 5]], stream_options=CONTINUOUS)
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        assert chunk["usage"]["prompt_tokens"] == [2, 5][choice["index"]]
    assert chunks[-1]["usage"]["prompt_tokens"] == 7


def test_echo_of_the_prompt_alone_generates_nothing(rig: Rig) -> None:
    chunks = _stream(
        rig, COMPLETIONS, prompt=[1, 2, 3], max_tokens=0, echo=True, stream_options=CONTINUOUS
    )
    assert [c["usage"] for c in chunks] == [_usage(3, 0), _usage(3, 0)]


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize(
    "options",
    [{"continuous_usage_stats": True}, {"include_usage": False, "continuous_usage_stats": True}],
)
def test_without_include_usage_it_changes_nothing(
    rig: Rig, path: str, options: dict[str, bool]
) -> None:
    """vLLM's rule: continuous usage only together with include_usage."""
    assert all(c["usage"] is None for c in _stream(rig, path, stream_options=options))


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_include_usage_alone_puts_usage_only_on_the_last_chunk(rig: Rig, path: str) -> None:
    chunks = _stream(rig, path, stream_options={"include_usage": True})
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] is not None
