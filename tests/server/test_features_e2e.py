"""Request features over HTTP with the official openai client and the real engine and cache:
vLLM's ``ignore_eos`` / ``min_tokens``, and the tier reported for a cold then warm adapter."""

from __future__ import annotations

from collections.abc import Iterator

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
