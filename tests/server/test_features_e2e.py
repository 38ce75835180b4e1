"""Request features over HTTP with the official openai client and the real engine and cache:
stop strings, vLLM's ``ignore_eos`` / ``min_tokens``, a prompt longer than the context, and the
tier reported for a cold then warm adapter."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from live import Live, client, live_server

from loraplex.demo.assets import DemoAdapter, DemoAssets

TIERS = ("L0", "L1", "L2", "L3")


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("serve-features")
    with live_server(demo_assets, data_dir, max_loras=4, max_num_seqs=8) as server:
        yield server


def _complete(live: Live, adapter: DemoAdapter, **extra: object) -> tuple[str, str | None, int]:
    api = client(live.url, live.key(adapter.tenant))
    done = api.completions.create(
        model=f"{adapter.name}@{adapter.revision}", prompt=adapter.probe_prompt, temperature=0,
        max_tokens=adapter.probe_max_tokens + 6, extra_body=extra,
    )  # fmt: skip
    assert done.usage is not None
    return done.choices[0].text, done.choices[0].finish_reason, done.usage.completion_tokens


def test_eos_ends_a_probe_unless_ignored_or_below_min_tokens(live: Live) -> None:
    adapter = live.assets.adapters[0]
    text, reason, tokens = _complete(live, adapter)
    assert text == adapter.expected_continuation and reason == "stop"
    assert tokens < adapter.probe_max_tokens + 6
    text, reason, tokens = _complete(live, adapter, ignore_eos=True)
    assert text.startswith(adapter.expected_continuation)
    assert reason == "length" and tokens == adapter.probe_max_tokens + 6
    text, _, tokens = _complete(live, adapter, min_tokens=adapter.probe_max_tokens + 3)
    assert text.startswith(adapter.expected_continuation)
    assert tokens >= adapter.probe_max_tokens + 3


def test_a_cold_adapter_reports_a_slower_tier_than_when_warm(live: Live) -> None:
    adapter = live.assets.adapters[-1]
    api = client(live.url, live.key(adapter.tenant))
    tiers = []
    for _ in range(2):
        raw = api.completions.with_raw_response.create(
            model=f"{adapter.name}@{adapter.revision}", prompt=adapter.probe_prompt,
            max_tokens=2, temperature=0,
        )  # fmt: skip
        reported = raw.parse().model_extra["loraplex"]["tier"]  # type: ignore[index]
        assert raw.headers["x-loraplex-tier"] == reported
        tiers.append(reported)
    assert tiers[1] == "L0" and TIERS.index(tiers[0]) > TIERS.index(tiers[1])


def test_stop_strings_cut_the_text_and_end_with_stop(live: Live) -> None:
    adapter = live.assets.adapters[0]
    expected = adapter.expected_continuation  # e.g. " is acme support r1 and early."
    cut = expected.index(" and")
    text, reason, tokens = _complete(live, adapter, stop=[" and", "never-produced"])
    assert (text, reason) == (expected[:cut], "stop")
    assert tokens < adapter.probe_max_tokens  # generation ended at the stop, not at EOS
    api = client(live.url, live.key(adapter.tenant))
    stream = api.completions.create(
        model=f"{adapter.name}@{adapter.revision}",
        prompt=adapter.probe_prompt,
        temperature=0,
        max_tokens=adapter.probe_max_tokens + 6,
        stop=" and",
        stream=True,
    )
    choices = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in choices) == expected[:cut]
    assert choices[-1].finish_reason == "stop"


def test_the_token_that_completes_a_stop_string_keeps_its_logprobs_entry(live: Live) -> None:
    """As vLLM: a stop string cuts the text only. The token that completed it was generated:
    usage counts it and it keeps its logprobs entry (its string holds the stop string's end, its
    ``text_offset`` may pass the text's end); streamed the same. Without the stop string, as
    many tokens give the same entries."""
    adapter = live.assets.adapters[0]
    expected = adapter.expected_continuation
    cut = expected.index(" and")
    api = client(live.url, live.key(adapter.tenant))
    asked = {
        "model": f"{adapter.name}@{adapter.revision}", "prompt": adapter.probe_prompt,
        "temperature": 0, "logprobs": 1,
    }  # fmt: skip
    done = api.completions.create(**asked, max_tokens=adapter.probe_max_tokens + 6, stop=" and")
    choice, usage = done.choices[0], done.usage
    assert (choice.text, choice.finish_reason) == (expected[:cut], "stop")
    assert choice.model_extra == {"stop_reason": " and"}
    logprobs = choice.logprobs
    assert logprobs is not None and usage is not None
    tokens = logprobs.tokens or []
    assert len(tokens) == len(logprobs.token_logprobs or []) == usage.completion_tokens
    joined = "".join(tokens)
    assert joined.startswith(choice.text)
    stop_end = joined.index(" and") + len(" and")
    assert len(joined) - len(tokens[-1]) < stop_end <= len(joined)  # the last token ends it
    assert (logprobs.text_offset or [])[-1] == len(joined) - len(tokens[-1])

    unstopped = api.completions.create(**asked, max_tokens=usage.completion_tokens)
    assert unstopped.choices[0].logprobs is not None
    assert unstopped.choices[0].logprobs.tokens == tokens
    assert unstopped.choices[0].logprobs.token_logprobs == logprobs.token_logprobs

    stream = api.completions.create(
        **asked, max_tokens=adapter.probe_max_tokens + 6, stop=" and", stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.text for p in pieces) == choice.text
    assert [t for p in pieces if p.logprobs for t in p.logprobs.tokens or []] == tokens
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == usage.completion_tokens


def test_a_prompt_longer_than_the_context_is_a_400_without_retry(live: Live) -> None:
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    limit = live.server.deps.config.max_prompt_tokens
    assert limit is not None
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(
            model=adapter.name, prompt="team " * (limit + 1), max_tokens=2, temperature=0
        )
    assert refused.value.code == "context_length_exceeded"
    assert "retry-after" not in refused.value.response.headers


def test_top_k_one_at_temperature_one_is_the_greedy_text(live: Live) -> None:
    """``top_k`` reaches the real sampler: keeping one token leaves nothing to draw from."""
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))

    def text(temperature: float, **extra: object) -> str:
        done = api.completions.create(
            model=f"{adapter.name}@{adapter.revision}",
            prompt=adapter.probe_prompt,
            max_tokens=24,
            temperature=temperature,
            seed=7,
            extra_body={"ignore_eos": True, **extra},
        )
        return done.choices[0].text

    greedy = text(0.0)
    assert text(1.0, top_k=1) == greedy
    assert text(1.0) != greedy  # the same seed without top_k draws other tokens
