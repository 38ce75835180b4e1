"""End to end over HTTP: ``build_server`` (demo bootstrap, real engine, real cache) behind uvicorn,
driven with the official openai client, streaming and not."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from live import Live, async_client, client, live_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from loraplex.demo.assets import DemoAdapter, DemoAssets


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("serve")
    with live_server(demo_assets, data_dir, max_loras=4, max_num_seqs=16) as server:
        yield server


async def _probe(live: Live, adapter: DemoAdapter, stream: bool) -> tuple[str, str]:
    """(text, revision reported) of ``adapter``'s probe, by its explicit revision."""
    api = async_client(live.url, live.key(adapter.tenant))
    model = f"{adapter.name}@{adapter.revision}"
    args = {"model": model, "prompt": adapter.probe_prompt, "temperature": 0,
            "max_tokens": adapter.probe_max_tokens}  # fmt: skip
    async with api:
        if not stream:
            done = await api.completions.create(**args)  # type: ignore[call-overload]
            return done.choices[0].text, done.model_extra["loraplex"]["revision"]
        parts: list[str] = []
        revisions: set[str] = set()
        async for chunk in await api.completions.create(stream=True, **args):  # type: ignore[call-overload]
            parts.extend(choice.text for choice in chunk.choices)
            revisions.add(chunk.model_extra["loraplex"]["revision"])
        assert len(revisions) == 1
        return "".join(parts), revisions.pop()


def test_every_demo_revision_answers_its_probe_concurrently(live: Live) -> None:
    adapters = list(live.assets.adapters)

    async def everything() -> list[tuple[str, str]]:
        jobs = [_probe(live, a, stream) for a in adapters for stream in (False, True)]
        return await asyncio.gather(*jobs)

    results = asyncio.run(everything())
    expected = [(a.expected_continuation, a.ref) for a in adapters for _ in (False, True)]
    assert results == expected


def test_revision_header_and_alias_resolution(live: Live) -> None:
    api = client(live.url, live.key("acme"))
    raw = api.completions.with_raw_response.create(
        model="support", prompt="The acme support team", max_tokens=9, temperature=0
    )
    assert raw.headers["x-loraplex-revision"] == "acme/support@r1"
    assert raw.parse().choices[0].text == " is acme support r1 and early."
    chat = api.chat.completions.create(
        model="acme/billing", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert chat.choices[0].message.role == "assistant"
    assert chat.model_extra is not None
    assert chat.model_extra["loraplex"]["revision"] == "acme/billing@r1"
    assert chat.usage is not None and 0 < chat.usage.completion_tokens <= 8


def test_tenants_cannot_use_list_or_detect_each_other(live: Live) -> None:
    api = client(live.url, live.key("acme"))
    listed = [m.id for m in api.models.list()]
    own = sorted({a.name for a in live.assets.adapters if a.tenant == "acme"})
    assert sorted(listed[1:]) == own and listed[0] == live.server.deps.config.base_model_name
    bodies = []
    for model in ("globex/search", "globex/search@r1", "globex/nonexistent"):
        with pytest.raises(openai.NotFoundError) as caught:
            api.completions.create(model=model, prompt="x", max_tokens=1)
        bodies.append(caught.value.response.text.replace(model, "MODEL"))
        with pytest.raises(openai.NotFoundError):
            api.models.retrieve(model)
    assert len(set(bodies)) == 1


def test_admin_routes_refuse_tenant_keys(live: Live) -> None:
    for tenant in ("acme", "globex", "initech"):
        auth = {"Authorization": f"Bearer {live.key(tenant)}"}
        for path in ("/admin/tenants", "/admin/residency", "/admin/keys", "/metrics"):
            assert httpx.get(live.url + path, headers=auth).status_code == 401
        body = {"name": f"{tenant}-evil"}
        assert httpx.post(live.url + "/admin/tenants", json=body, headers=auth).status_code == 401
    admin = {"Authorization": f"Bearer {live.server.admin_key}"}
    assert httpx.get(live.url + "/admin/residency", headers=admin).status_code == 200


def test_metrics_follow_the_endpoint_picker_contract(live: Live) -> None:
    # running_lora_adapters lists the adapters of running requests (vLLM's meaning). A thread
    # scrapes /metrics over and over while a long stream of globex/search is read to its end in
    # this one: read (never paused for backpressure) and scraped from before its first token to
    # after its last, the request is seen running whatever the machine's speed. NOTE: one scrape
    # loop after the first token, the stream left unread, saw nothing on a busy CI runner (the
    # request ended, or was paused, before a scrape saw it).
    admin = {"Authorization": f"Bearer {live.server.admin_key}"}
    scrapes: list[dict[str, Metric]] = []
    streaming = threading.Event()
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            text = httpx.get(live.url + "/metrics", headers=admin).text
            if streaming.is_set():
                scrapes.append({f.name: f for f in text_string_to_metric_families(text)})
            time.sleep(0.01)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        stream = client(live.url, live.key("globex")).completions.create(
            model="search", prompt="The globex search team", max_tokens=400, temperature=0,
            stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        with stream:
            for _ in stream:
                streaming.set()
        # a few scrapes after the last token: the finished request leaves the running list
        streaming.clear()
        time.sleep(0.3)
        streaming.set()
        ended = len(scrapes)
        while len(scrapes) < ended + 3:
            time.sleep(0.02)
    finally:
        done.set()
        scraper.join()
    infos = [families["vllm:lora_requests_info"].samples for families in scrapes]
    labels = [info.labels for (info,) in infos]
    assert {label["max_lora"] for label in labels} == {"4"}

    def adapters(label: dict[str, str], key: str) -> set[str]:
        return set(filter(None, label[key].split(",")))

    seen = [adapters(label, "running_lora_adapters") for label in labels[:ended]]
    assert any("globex/search" in running for running in seen), f"{len(seen)} scrapes"
    for label in labels[:ended]:
        if "globex/search" in adapters(label, "running_lora_adapters"):
            assert "globex/search" not in adapters(label, "waiting_lora_adapters")
    after = labels[-1]
    assert "globex/search" not in adapters(after, "running_lora_adapters") | adapters(
        after, "waiting_lora_adapters"
    )
    families = scrapes[-1]
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:lora_requests_info"):  # fmt: skip
        assert families[name].type == "gauge", name
    assert 0.0 <= families["vllm:kv_cache_usage_perc"].samples[0].value <= 1.0
    assert families["adapter_cache_hits"].samples
    assert families["adapter_load_stage_seconds"].samples


def test_ready_and_health(live: Live) -> None:
    assert httpx.get(live.url + "/ready").json() == {"status": "ready"}
    assert httpx.get(live.url + "/health").json() == {"status": "ok"}
