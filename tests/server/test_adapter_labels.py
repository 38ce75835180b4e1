"""Adapter names in /metrics labels are bounded: at most ``max_adapter_labels`` adapters are
named at a time, every other one is ``__other__`` (per priority class in the request counts), a
name unseen for a while is given back, and no request is lost from the counts on the way."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from loraplex.demo.assets import DemoAssets
from loraplex.serve.config import ServeConfig
from loraplex.server.adapter_labels import (
    DEFAULT_MAX_NAMED,
    FORGET_AFTER_S,
    OTHER,
    AdapterLabels,
)
from loraplex.server.app import create_app

CAP = 2


class _Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_past_the_cap_adapters_are_other_per_class_and_every_request_is_counted() -> None:
    names = AdapterLabels(max_named=3, clock=_Clock())
    sent: Counter[str] = Counter()
    for i in list(range(10)) * 5:  # one tenant cycling through 10 adapters, in two classes
        cls = "high" if i % 2 else "normal"
        names.count_request(f"acme/a{i}", cls)
        sent[cls] += 1
    totals = names.request_totals()
    assert {label for label, _, _ in totals} == {"acme/a0", "acme/a1", "acme/a2", OTHER}
    assert len(totals) <= 3 + 2  # named ones, plus one __other__ series per class
    by_class: Counter[str] = Counter()
    for _, cls, count in totals:
        by_class[cls] += count
    assert by_class == sent  # nothing lost
    assert names.labels(["acme/a9", "acme/a0", "acme/a7"]) == [OTHER, "acme/a0"]


def test_a_name_unseen_for_a_while_is_given_back_and_its_requests_move_to_other() -> None:
    clock = _Clock()
    names = AdapterLabels(max_named=1, clock=clock)
    names.count_request("acme/old", "normal")
    names.count_request("acme/new", "normal")
    assert names.request_totals() == [(OTHER, "normal", 1), ("acme/old", "normal", 1)]
    clock.now_s = FORGET_AFTER_S - 1
    assert names.labels(["acme/old"]) == ["acme/old"]  # seen: keeps its name
    clock.now_s += FORGET_AFTER_S
    assert names.labels(["acme/new"]) == ["acme/new"]  # old was unseen: its name is free
    assert names.request_totals() == [(OTHER, "normal", 2)]


def test_one_tenant_cannot_keep_every_name_from_another() -> None:
    """acme requests 4 adapters every minute, holding every name; globex's adapter used to be
    ``OTHER`` for good. It now takes acme's least recently seen name, down to an equal share."""
    clock = _Clock()
    names = AdapterLabels(max_named=4, clock=clock)
    for minute in range(3):
        clock.now_s = 60.0 * minute
        for i in range(4):
            names.count_request(f"acme/a{i}", "normal")
    assert names.labels(["globex/search"]) == ["globex/search"]
    assert names.labels(["globex/chat"]) == ["globex/chat"]
    assert names.labels(["globex/code"]) == [OTHER]  # 2 and 2: an equal share each
    assert names.labels([f"acme/a{i}" for i in range(4)]) == [OTHER, "acme/a2", "acme/a3"]
    totals = names.request_totals()
    assert sum(n for _, _, n in totals) == 12  # acme's requests: nothing lost
    assert (OTHER, "normal", 6) in totals  # a0's and a1's moved to OTHER with their names


def test_a_cap_of_zero_names_no_adapter() -> None:
    names = AdapterLabels(max_named=0)
    assert names.labels(["acme/a", "acme/b"]) == [OTHER]
    with pytest.raises(ValueError, match=r"^max_named -1 is invalid; expected >= 0$"):
        AdapterLabels(max_named=-1)


@pytest.fixture
def capped(served: Served) -> Iterator[Rig]:
    engine = FakeEngine()
    deps = make_app_deps(served, engine, max_adapter_labels=CAP)
    assert deps.cache is not None
    with TestClient(create_app(deps)) as client:
        yield Rig(client, engine, served, deps.cache)
    deps.cache.close()


def _families(rig: Rig) -> dict[str, list[dict[str, str]]]:
    text = rig.client.get("/metrics", headers=rig.admin).text
    families = text_string_to_metric_families(text)
    return {f.name: [{**s.labels, "value": str(s.value)} for s in f.samples] for f in families}


def test_cycling_adapters_keeps_the_series_bounded_on_a_server(
    capped: Rig, demo_assets: DemoAssets
) -> None:
    acme = [a for a in demo_assets.adapters if a.tenant == "acme"]
    info_sets = set()
    for adapter in acme * 2:  # each running a request in turn, requested there, scraped
        capped.engine.lora_running = (adapter.key(demo_assets.base_digest),)
        body = {"model": f"{adapter.name}@{adapter.revision}", "prompt": "x", "max_tokens": 1}
        reply = capped.client.post("/v1/completions", json=body, headers=capped.headers("acme"))
        assert reply.status_code == 200, reply.text
        (info,) = _families(capped)["vllm:lora_requests_info"]
        info_sets.add((info["running_lora_adapters"], info["waiting_lora_adapters"]))
    assert len({a.name for a in acme}) > CAP + 1
    assert len(info_sets) <= CAP + 1  # named adapters, plus __other__
    totals = _families(capped)["adapter_requests"]
    series = {(s["adapter"], s["priority_class"]) for s in totals}
    assert len(series) == len(totals) <= CAP + 1 and (OTHER, "normal") in series
    assert sum(float(s["value"]) for s in totals) == 2 * len(acme)  # every request counted


def test_a_negative_cap_is_refused_naming_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^max_adapter_labels -1 is invalid; expected >= 0$"):
        ServeConfig(data_dir=tmp_path, max_adapter_labels=-1)
    assert ServeConfig(data_dir=tmp_path).max_adapter_labels == DEFAULT_MAX_NAMED
