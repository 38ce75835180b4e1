"""The verdicts no real deployment can be misconfigured into here, judged on observations built
by the test: loraplex never evicts a copy in use, cannot run a fleet router-less, and always
mounts the release API. The checks must still FAIL if a deployment ever did."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.preflight.checks_registry import canary_prewarm_rollback
from loraplex.preflight.checks_runtime import (
    load_unload_not_exposed,
    no_eviction_in_use,
    router_affinity_and_load,
)
from loraplex.preflight.client import Answer, Metrics
from loraplex.preflight.load import LoadResult, Outcome
from loraplex.preflight.observe import InUseProbe, Observation, RegistryView
from loraplex.preflight.report import ITEM_IDS, Report, Status, Verdict


def _observation(**changes: Any) -> Observation:
    fields: dict[str, Any] = {
        "registry": RegistryView([], [], False),
        "fleet": {"policy": None, "replicas": [{"replica_id": "local"}], "decisions": {}},
        "releases": Answer("GET", "/admin/releases", 200, []),
        "before": Metrics([]),
        "after": Metrics([]),
        "residency": {},
        "refusals": (),
        "load": None,
        "load_note": "",
        "in_use": None,
    }
    return Observation(**{**fields, **changes})


def _probe(evicted: bool, complete: bool = True, pinned: bool = False) -> InUseProbe:
    answer = Answer("POST", "/admin/residency/evict", 200, {"evicted": evicted})
    copy = {"pinned": pinned, "refcount": 1}
    return InUseProbe("acme/support@r1", answer, copy, 200, complete, "stream ran to [DONE]")


def test_a_refused_stream_is_not_judged_and_says_why() -> None:
    note = "stream refused: status 429, Retry-After 2 s: tenant acme's queue is full"
    probe = InUseProbe("acme/support@r1", None, None, 429, False, note)
    verdict = no_eviction_in_use(_observation(in_use=probe))
    assert verdict.status is Status.WARN
    assert verdict.summary == f"no stream to hold an adapter in use: not judged ({note})"


def test_an_in_use_copy_evicted_fails() -> None:
    assert no_eviction_in_use(_observation(in_use=_probe(False))).status is Status.PASS
    failed = no_eviction_in_use(_observation(in_use=_probe(True)))
    assert failed.status is Status.FAIL
    assert "in use was evicted" in failed.summary
    broken = no_eviction_in_use(_observation(in_use=_probe(False, complete=False)))
    assert broken.status is Status.FAIL
    assert no_eviction_in_use(_observation()).status is Status.WARN
    pinned = no_eviction_in_use(_observation(in_use=_probe(False, pinned=True)))
    assert pinned.status is Status.WARN  # a pinned copy is kept anyway: proves nothing


def test_each_refusal_names_the_credential_it_was_asked_with() -> None:
    """Item 11 asks the load routes twice, with a tenant key and with none: the evidence said
    "(tenant key or none)" of every call, so the two read as the same call made twice."""
    load = Answer("POST", "/v1/load_lora_adapter", 401, {})
    asked = (("tenant key", load), ("no key", load))
    verdict = load_unload_not_exposed(_observation(refusals=asked))
    assert verdict.status is Status.PASS
    assert verdict.evidence == (
        "POST /v1/load_lora_adapter -> 401 (tenant key)",
        "POST /v1/load_lora_adapter -> 401 (no key)",
    )
    opened = (("tenant key", load), ("no key", Answer("POST", "/v1/load_lora_adapter", 200, {})))
    failed = load_unload_not_exposed(_observation(refusals=opened))
    assert failed.status is Status.FAIL
    assert failed.summary.endswith("POST /v1/load_lora_adapter -> 200 (no key)")


@pytest.mark.parametrize(
    ("policy", "status"),
    [
        ("affinity_until_saturated", Status.PASS),
        ("pow2", Status.FAIL),  # load only
        ("ray_multiplex", Status.FAIL),  # affinity only
        ("affinity", Status.FAIL),  # affinity whatever the load
        (None, Status.WARN),  # one server
    ],
)
def test_the_router_must_weigh_affinity_and_load(policy: str | None, status: Status) -> None:
    fleet = {"policy": policy, "replicas": [{}, {}], "decisions": {}}
    assert router_affinity_and_load(_observation(fleet=fleet)).status is status


def test_a_fleet_router_that_counted_none_of_the_load_fails() -> None:
    """Decisions are read after the load test (``observe``): a router that routed the load's
    requests shows them; none counted means the fleet view does not show what it routed."""
    answered = Outcome("support", "hot", 200, 0.1, "acme/support@r1", "d" * 64, None)
    refused = Outcome("support", "hot", 503, 0.1, None, None, "no replica")
    load = LoadResult((answered, answered, refused), (), (), 1.0)
    policy = "affinity_until_saturated"
    empty = {"policy": policy, "replicas": [{}, {}], "decisions": {}}
    failed = router_affinity_and_load(_observation(fleet=empty, load=load))
    assert failed.status is Status.FAIL
    assert "no decisions although 2 load requests were answered" in failed.summary
    counted = {**empty, "decisions": {"gpu_hit": 1, "placement": 1}}
    passed = router_affinity_and_load(_observation(fleet=counted, load=load))
    assert passed.status is Status.PASS and "gpu_hit" in passed.evidence[0]


def test_no_release_api_fails() -> None:
    missing = Answer("GET", "/admin/releases", 404, {"detail": "Not Found"})
    verdict = canary_prewarm_rollback(_observation(releases=missing))
    assert verdict.status is Status.FAIL
    assert "404" in verdict.evidence[0]


def test_a_report_needs_every_item_once_and_exits_1_on_a_fail() -> None:
    verdicts = tuple(Verdict(i, Status.PASS, "ok") for i in ITEM_IDS)
    assert Report("http://x", verdicts).exit_code() == 0
    one_warn = (Verdict(ITEM_IDS[0], Status.WARN, "why"), *verdicts[1:])
    assert Report("http://x", one_warn).exit_code() == 0
    one_fail = (*verdicts[:-1], Verdict(ITEM_IDS[-1], Status.FAIL, "why"))
    assert Report("http://x", one_fail).exit_code() == 1
    with pytest.raises(ValueError, match=r"verdicts .* are invalid"):
        Report("http://x", verdicts[1:])
    with pytest.raises(ValueError, match="item_id 'nope' is invalid"):
        Verdict("nope", Status.PASS, "")
