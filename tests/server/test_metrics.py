"""/metrics: parseable, bounded labels, and the endpoint-picker (vllm:*) contract."""

from __future__ import annotations

import time

import pytest
from conftest import BASE_NAME, Rig, Served, make_app_deps
from fakes import QUEUE_S, FakeEngine
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from loraplex.demo.assets import DemoAssets
from loraplex.residency.ledger import Tier
from loraplex.server.app import create_app
from loraplex.server.metrics_status import StatusCounts, code_label


def _scrape(rig: Rig) -> dict[str, list[Sample]]:
    response = rig.client.get("/metrics", headers=rig.admin)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = text_string_to_metric_families(response.text)
    return {family.name: family.samples for family in families}


def test_endpoint_picker_family(rig: Rig, demo_assets: DemoAssets) -> None:
    base = demo_assets.base_digest
    support = demo_assets.adapter("acme", "support", "r1").key(base)
    support_r2 = demo_assets.adapter("acme", "support", "r2").key(base)
    legal = demo_assets.adapter("acme", "legal", "r1").key(base)
    search = demo_assets.adapter("globex", "search", "r1").key(base)
    rig.engine.running = (support, search, legal)  # in GPU slots: not what the lists say
    rig.engine.waiting = (support_r2,)
    rig.engine.lora_running = (support, search)  # adapters of running requests
    rig.engine.lora_waiting = (legal, support_r2, search)  # of queued ones
    before = time.time()
    metrics = _scrape(rig)
    assert metrics["vllm:num_requests_waiting"][0].value == 1 + 1  # the fake: 1 + len(waiting)
    assert metrics["vllm:num_requests_running"][0].value == 2
    usage = metrics["vllm:kv_cache_usage_perc"][0].value
    assert 0.0 <= usage <= 1.0 and usage == 0.25
    # vLLM's model_name label (the served model's name), on the series vLLM labels with it:
    # a vLLM dashboard's {model_name="..."} filter found none of them
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        (sample,) = metrics[name]
        assert sample.labels == {"model_name": BASE_NAME}, name
    assert metrics["vllm:kv_cache_usage_perc"][0].labels == {"model_name": BASE_NAME}
    (info,) = metrics["vllm:lora_requests_info"]
    assert set(info.labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert info.labels["max_lora"] == "4"
    running = info.labels["running_lora_adapters"].split(",")
    waiting = info.labels["waiting_lora_adapters"].split(",")
    # vLLM's meaning: adapters with running requests, with queued ones (both: in both), by
    # name; not the slots (acme/legal, resident, has no running request)
    assert running == ["acme/support", "globex/search"]
    assert waiting == ["acme/legal", "acme/support", "globex/search"]
    assert before - 1 <= info.value <= time.time() + 1


def test_engine_requests_by_state_and_pauses(rig: Rig) -> None:
    """Paused requests (their clients stopped reading) are a state of their own, and pauses
    and resumes are counted; so are the pauses that kept their KV and the kept KV freed for
    other work (a resume of those recomputes: a client that keeps falling behind on a full
    engine shows as both growing)."""
    metrics = _scrape(rig)
    states = {s.labels["state"]: s.value for s in metrics["engine_requests"]}
    assert states == {"waiting": 1, "adapter_wait": 0, "running": 2, "paused": 3}
    assert metrics["engine_request_pauses"][0].value == 5
    assert metrics["engine_request_resumes"][0].value == 2
    assert metrics["engine_request_pauses_kv_kept"][0].value == 4
    assert metrics["engine_paused_kv_freed"][0].value == 1
    assert metrics["engine_resume_recomputed_tokens"][0].value == 37


def test_empty_adapter_lists_are_empty_strings(rig: Rig) -> None:
    (info,) = _scrape(rig)["vllm:lora_requests_info"]
    assert info.labels["running_lora_adapters"] == ""
    assert info.labels["waiting_lora_adapters"] == ""


def test_request_metrics_split_by_cold_and_priority_class(
    rig: Rig, demo_assets: DemoAssets
) -> None:
    headers = rig.headers("acme")
    rig.engine.running = (
        demo_assets.adapter("acme", "support", "r1").key(demo_assets.base_digest),
    )
    for model in ("support", "support", "legal"):
        body = {"model": model, "prompt": "hi", "max_tokens": 8}
        assert rig.client.post("/v1/completions", json=body, headers=headers).status_code == 200
    metrics = _scrape(rig)
    counts = {
        s.labels["cold"]: s.value
        for s in metrics["request_ttft_seconds"]
        if s.name.endswith("_count")
    }
    assert counts == {"false": 2, "true": 1}
    waits = {s.labels["cold"]: s.value for s in metrics["request_queue_wait_seconds"]
             if s.name.endswith("_sum")}  # fmt: skip
    assert waits == pytest.approx({"false": 2 * QUEUE_S, "true": QUEUE_S})
    assert metrics["cold_start_rate"][0].value == 1 / 3
    finished = {
        (s.labels["priority_class"], s.labels["outcome"]): s.value
        for s in metrics["requests"]
        if s.name == "requests_total"
    }
    assert finished == {("normal", "stop"): 3}
    tokens = [s for s in metrics["generated_tokens"] if s.name == "generated_tokens_total"]
    assert tokens[0].value == 6


def test_cache_metrics_follow_design(rig: Rig) -> None:
    metrics = _scrape(rig)
    for name in (
        "adapter_cache_hits", "adapter_cache_misses", "adapter_resident_count",
        "adapter_resident_bytes", "adapter_evictions", "adapter_reload_after_eviction",
        "adapter_thrash_ratio", "adapter_load_stage_seconds", "adapter_thrash_events",
    ):  # fmt: skip
        assert name in metrics, name
    for name in (
        "adapter_resident_bytes",
        "adapter_reload_after_eviction",
        "adapter_thrash_events",
    ):
        tiers = {s.labels["tier"] for s in metrics[name]}
        assert tiers == {"L0", "L1", "L2"}, name


def test_cache_metrics_read_the_cache_summary(rig: Rig) -> None:
    for revision in rig.served.demo.revisions[:2]:
        rig.cache.acquire_future(revision.key()).result(timeout=10).release()
    summary = rig.cache.summary()
    metrics = _scrape(rig)
    misses = metrics["adapter_cache_misses"]
    assert [s.value for s in misses if s.name == "adapter_cache_misses_total"] == [
        summary.stats.misses
    ]
    assert summary.stats.misses >= 2
    for sample in metrics["adapter_resident_count"]:
        tier = Tier[sample.labels["tier"]]
        assert sample.value == summary.num_copies.get(tier, 0)
    for sample in metrics["adapter_resident_bytes"]:
        assert sample.value == summary.used_bytes.get(Tier[sample.labels["tier"]], 0)


def test_labels_stay_bounded(rig: Rig, demo_assets: DemoAssets) -> None:
    for adapter in demo_assets.adapters:
        if adapter.tenant == "acme":
            body = {"model": f"{adapter.name}@{adapter.revision}", "prompt": "x", "max_tokens": 1}
            rig.client.post("/v1/completions", json=body, headers=rig.headers("acme"))
    allowed = {"tier", "stage", "cold", "priority_class", "outcome", "state", "le", "quantile"}
    allowed.add("code")  # 429, 503 or a status class (metrics_status.code_label)
    allowed.add("model_name")  # the one served base model's name (vLLM's label)
    for name, samples in _scrape(rig).items():
        if name in ("vllm:lora_requests_info", "adapter_requests"):
            continue  # adapter names, at most max_adapter_labels of them: test_adapter_labels
        for sample in samples:
            assert set(sample.labels) <= allowed, (name, sample.labels)


def test_metrics_need_the_admin_key_unless_public(served: Served) -> None:
    with TestClient(create_app(make_app_deps(served, FakeEngine()))) as client:
        tenant = {"Authorization": f"Bearer {served.keys['acme']}"}
        assert client.get("/metrics", headers=tenant).status_code == 401
        assert client.get("/metrics").status_code == 401
    with TestClient(create_app(make_app_deps(served, FakeEngine(), metrics_public=True))) as client:
        assert client.get("/metrics").status_code == 200


def test_health_and_ready(rig: Rig) -> None:
    assert rig.client.get("/health").json() == {"status": "ok"}
    assert rig.client.get("/ready").json() == {"status": "ready"}


def test_tenant_responses_count_by_class_and_status(rig: Rig, demo_assets: DemoAssets) -> None:
    adapter = demo_assets.adapter("acme", "support", "r1")
    ok = {"model": f"{adapter.name}@{adapter.revision}", "prompt": "x", "max_tokens": 1}
    assert rig.client.post("/v1/completions", json=ok, headers=rig.headers("acme")).is_success
    unknown = {**ok, "model": "no-such-adapter"}
    refused = rig.client.post("/v1/completions", json=unknown, headers=rig.headers("acme"))
    assert refused.status_code == 404
    anonymous = rig.client.post("/v1/completions", json=ok)  # no key: no class, not counted
    assert anonymous.status_code == 401
    counts = {
        (s.labels["priority_class"], s.labels["code"]): s.value
        for s in _scrape(rig)["loraplex_tenant_responses"]
        if s.name == "loraplex_tenant_responses_total"
    }
    codes = ("429", "503", "5xx")
    zeros = {(c, code): 0 for c in ("high", "normal", "batch") for code in codes}
    assert counts == {**zeros, ("normal", "2xx"): 1, ("normal", "4xx"): 1}


def test_the_5xx_series_of_every_class_starts_at_0() -> None:
    """LoraplexServerErrors takes increase() of code="5xx": a series born at its first count
    hides that count (an adapter that failed to load gave three 500s before one scrape and no
    alert fired, newop4), so 5xx is exported at 0 from the start as 429 and 503 are."""
    (family,) = StatusCounts().collect()
    seen = {(s.labels["priority_class"], s.labels["code"]): s.value for s in family.samples}
    for priority_class in ("high", "normal", "batch"):
        assert seen[(priority_class, "5xx")] == 0


@pytest.mark.parametrize(
    ("status", "label"), [(200, "2xx"), (429, "429"), (503, "503"), (500, "5xx"), (408, "4xx")]
)
def test_status_code_labels_are_a_fixed_set(status: int, label: str) -> None:
    assert code_label(status) == label


def test_a_rate_limited_request_is_counted_as_429_of_its_tenants_class(rig: Rig) -> None:
    """Refused by ``RequestLimits`` before any route ran, and still counted (under batch)."""
    created = rig.client.post("/admin/tenants", json={"name": "bursty-batch"}, headers=rig.admin)
    assert created.status_code in (200, 201)
    settings = {"priority": "batch", "quotas": {"max_requests_per_s": 0.01}}  # then 1 per 100 s
    changed = rig.client.put("/admin/tenants/bursty-batch", json=settings, headers=rig.admin)
    assert changed.status_code == 200, changed.text
    token = rig.client.post("/admin/tenants/bursty-batch/keys", headers=rig.admin).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    body = {"model": BASE_NAME, "prompt": "hi", "max_tokens": 2}
    assert rig.client.post("/v1/completions", json=body, headers=headers).status_code == 200
    assert rig.client.post("/v1/completions", json=body, headers=headers).status_code == 429
    counts = {
        (s.labels["priority_class"], s.labels["code"]): s.value
        for s in _scrape(rig)["loraplex_tenant_responses"]
        if s.name == "loraplex_tenant_responses_total"
    }
    assert counts[("batch", "2xx")] == 1 and counts[("batch", "429")] == 1
    assert counts[("normal", "429")] == 0
