"""The HTTP side of issue 15 against the real engine: ``n`` with seeds, a batch of prompts on
concurrent adapters, logprobs (greedy picks the top token) and echo's loglikelihood request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from live import Live, async_client, client, live_server

from loraplex.demo.assets import DemoAssets


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("serve-sampling")
    with live_server(demo_assets, data_dir, max_loras=4, max_num_seqs=8) as server:
        yield server


def test_n_choices_equal_single_requests_with_seed_plus_i(live: Live) -> None:
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    model = f"{adapter.name}@{adapter.revision}"
    prompt = adapter.probe_prompt

    def texts(n: int, seed: int) -> list[str]:
        done = api.completions.create(
            model=model, prompt=prompt, max_tokens=8, temperature=1.0, n=n, seed=seed
        )
        return [c.text for c in sorted(done.choices, key=lambda c: c.index)]

    fanned = texts(3, 11)
    alone = [texts(1, 11 + i)[0] for i in range(3)]
    assert fanned == alone and len(set(alone)) > 1  # the seeds differ, so do the texts


def test_a_batch_answers_each_prompt_and_adapters_mix_concurrently(live: Live) -> None:
    first, second = live.assets.adapters[0], live.assets.adapters[1]

    async def ask(adapter_index: int) -> list[str]:
        adapter = live.assets.adapters[adapter_index]
        api = async_client(live.url, live.key(adapter.tenant))
        done = await api.completions.create(
            model=f"{adapter.name}@{adapter.revision}",
            temperature=0,
            prompt=[adapter.probe_prompt, adapter.probe_prompt],
            max_tokens=adapter.probe_max_tokens,
        )
        return [c.text for c in sorted(done.choices, key=lambda c: c.index)]

    async def both() -> list[list[str]]:
        return list(await asyncio.gather(ask(0), ask(1)))

    texts = asyncio.run(both())
    assert texts[0] == [first.expected_continuation] * 2
    assert texts[1] == [second.expected_continuation] * 2


def test_greedy_logprobs_name_the_top_token(live: Live) -> None:
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    done = api.completions.create(
        model=f"{adapter.name}@{adapter.revision}", prompt=adapter.probe_prompt, max_tokens=4,
        temperature=0, logprobs=2,
    )  # fmt: skip
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs
    assert "".join(logprobs.tokens) == done.choices[0].text
    for token, value, top in zip(
        logprobs.tokens, logprobs.token_logprobs or [], logprobs.top_logprobs, strict=True
    ):
        assert value is not None and value == max(top.values()) and top[token] == value


def test_echo_with_zero_max_tokens_scores_the_prompt(live: Live) -> None:
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    done = api.completions.create(
        model=f"{adapter.name}@{adapter.revision}", prompt=adapter.probe_prompt, max_tokens=0,
        echo=True, logprobs=1, temperature=0,
    )  # fmt: skip
    choice = done.choices[0]
    assert choice.text == adapter.probe_prompt
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    values: list[float | None] = list(choice.logprobs.token_logprobs)
    assert values[0] is None and len(values) > 2
    assert all(v is not None and v <= 0 for v in values[1:])
    assert done.usage is not None and done.usage.completion_tokens == 0


def test_special_tokens_keep_their_own_strings_in_top_logprobs(live: Live) -> None:
    """Special tokens decode to "" in text, but as logprob keys they must stay distinct: with
    logprobs=20 every position lists 20 (or 21, with the chosen token) different strings."""
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    specials = [1, 2, 3, 4]  # the demo tokenizer's special ids sit at the bottom of the vocab
    done = api.completions.create(
        model=f"{adapter.name}@{adapter.revision}", prompt=[[1, 40, 41, *specials, 42]],
        max_tokens=1, echo=True, logprobs=20, temperature=0,
    )  # fmt: skip
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None
    assert all(top is None or len(top) >= 20 for top in logprobs.top_logprobs)
    assert logprobs.tokens is not None and logprobs.tokens[0] == "<|bos|>"
    assert "" not in logprobs.tokens[: len(specials) + 4]


def test_echoed_text_offsets_index_the_returned_text(live: Live) -> None:
    """``text_offset`` are positions in the returned ``text``: under ``echo`` the first token is
    ``<|bos|>``, which the text does not hold, so it advances the offsets by nothing (they
    counted its 7 characters: ``text[text_offset[i]:]`` did not start with ``tokens[i]``).
    Streamed, the same offsets."""
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    asked = {
        "model": f"{adapter.name}@{adapter.revision}", "prompt": adapter.probe_prompt,
        "max_tokens": 4, "echo": True, "logprobs": 1, "temperature": 0,
    }  # fmt: skip
    choice = api.completions.create(**asked).choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.text_offset
    tokens, offsets = logprobs.tokens, logprobs.text_offset
    assert choice.text.startswith(adapter.probe_prompt) and tokens[0] == "<|bos|>"
    assert offsets[:2] == [0, 0]
    for token, offset in zip(tokens[1:], offsets[1:], strict=True):
        assert choice.text[offset : offset + len(token)] == token, (token, offset)
    assert offsets[-1] + len(tokens[-1]) == len(choice.text)

    streamed = api.completions.create(**asked, stream=True)
    parts = [c.choices[0] for c in streamed if c.choices]
    assert "".join(p.text for p in parts) == choice.text
    assert [o for p in parts if p.logprobs for o in p.logprobs.text_offset or ()] == offsets


def test_text_offsets_of_a_character_split_over_byte_tokens_point_at_it(live: Live) -> None:
    """The demo tokenizer is a byte-level BPE: an emoji is 4 byte tokens, each decoding alone
    to U+FFFD. Each counted one character, so every offset after an emoji was 3 past its token
    (attack30); each now points at the character it is part of. Streamed, the same offsets."""
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    prompt = "a\U0001f600b \U0001f600\U0001f600 hi"
    asked = {
        "model": f"{adapter.name}@{adapter.revision}", "prompt": prompt, "max_tokens": 4,
        "echo": True, "logprobs": 0, "temperature": 0,
    }  # fmt: skip
    choice = api.completions.create(**asked).choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.text_offset
    tokens, offsets = logprobs.tokens, logprobs.text_offset
    assert tokens.count("\ufffd") >= 12  # 3 emoji of byte tokens
    text = choice.text
    assert offsets == sorted(offsets) and offsets[-1] < len(text)
    for token, offset in zip(tokens[1:], offsets[1:], strict=True):
        if token == "\ufffd":
            assert text[offset] == "\U0001f600", (offsets, tokens)
        else:
            assert text[offset : offset + len(token)] == token, (token, offset)

    streamed = api.completions.create(**asked, stream=True)
    parts = [c.choices[0] for c in streamed if c.choices]
    assert "".join(p.text for p in parts) == text
    assert [o for p in parts if p.logprobs for o in p.logprobs.text_offset or ()] == offsets


def test_chat_logprob_bytes_of_byte_tokens_are_their_bytes(live: Live) -> None:
    """An emoji's first byte token forced by ``logit_bias``: chat's ``bytes`` for it are
    ``[240]``, so a client can join a split character back; they were ``[239, 191, 189]``, the
    UTF-8 of the U+FFFD the token shows (attack30). Streamed, the same."""
    adapter = live.assets.adapters[0]
    api = client(live.url, live.key(adapter.tenant))
    tokenized = httpx.post(
        f"{live.url}/tokenize", json={"model": adapter.name, "prompt": "\U0001f600"},
        headers={"Authorization": f"Bearer {live.key(adapter.tenant)}"},
    ).json()["tokens"]  # fmt: skip
    lead = tokenized[1]  # after BOS: the byte token of 0xF0
    asked = {
        "model": f"{adapter.name}@{adapter.revision}", "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 1,
        "logit_bias": {str(lead): 100},
    }  # fmt: skip
    done = api.chat.completions.create(**asked)
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    assert [(e.token, e.bytes) for e in logprobs.content] == [("\ufffd", [0xF0])] * 3
    tops = [t for e in logprobs.content for t in e.top_logprobs if t.token == "\ufffd"]
    assert all(t.bytes != [239, 191, 189] and len(t.bytes) == 1 for t in tops)
    streamed = api.chat.completions.create(**asked, stream=True)
    got = [e.bytes for c in streamed if c.choices and c.choices[0].logprobs
           for e in c.choices[0].logprobs.content or ()]  # fmt: skip
    assert got == [[0xF0]] * 3
