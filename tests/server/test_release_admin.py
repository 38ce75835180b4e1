"""/admin/releases: credentials, the listener split, validation, operator actions, and the
controller driven through ServeReleaseEnv on the fake engine (a failing probe rolls back with
no canary traffic). A registry of its own: releases move aliases."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ADMIN_KEY, BASE_NAME
from fakes import FakeEngine, null_cache
from fastapi.testclient import TestClient

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.registry import RegistrationRequest, Registry, RegistryConfig, open_registry
from loraplex.release.controller import ReleaseController
from loraplex.release.traffic import ReleaseTraffic
from loraplex.serve.bootstrap import register_demo, sample_keys
from loraplex.serve.release_env import ReleaseLoop, ServeReleaseEnv
from loraplex.server.app import create_app
from loraplex.server.deps import ServerConfig, ServerDeps
from loraplex.server.listeners import AdminBindGuard
from loraplex.server.pin_owners import OwnedPins

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
WAIT_S = 30.0


@dataclass
class Plant:
    client: TestClient
    deps: ServerDeps
    registry: Registry
    keys: dict[str, str]
    clock: ManualClock


@pytest.fixture
def plant(demo_assets: DemoAssets, tmp_path: Path) -> Iterator[Plant]:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    registry = open_registry(RegistryConfig(tmp_path), base=base)
    demo = register_demo(registry, demo_assets)
    keys = sample_keys(registry, demo.tenants, tmp_path)
    clock = ManualClock(1000.0)
    traffic = ReleaseTraffic(clock, tuple)
    config = ServerConfig(base_model_name=BASE_NAME, admin_key=ADMIN_KEY)
    cache = null_cache()
    deps = ServerDeps(
        config, FakeEngine(), registry, cache, None, refresh_tenants=lambda: None, releases=traffic
    )
    with TestClient(create_app(deps)) as client:
        yield Plant(client, deps, registry, keys, clock)
    cache.close()
    registry.close()


def _start(plant: Plant, **fields: Any) -> Any:
    """POST a release; the body is encoded by Python's ``json``, which writes ``NaN`` and
    ``Infinity`` for non-finite floats (httpx's ``json=`` refuses them), as a client could."""
    body = {"tenant": "acme", "name": "support", "revision": "r2", **fields}
    headers = {**ADMIN, "Content-Type": "application/json"}
    return plant.client.post("/admin/releases", content=json.dumps(body), headers=headers)


def test_admin_credential_required(plant: Plant) -> None:
    tenant = {"Authorization": f"Bearer {plant.keys['acme']}"}
    for headers in ({}, tenant):
        assert plant.client.get("/admin/releases", headers=headers).status_code == 401
        assert _start_with(plant, headers).status_code == 401
    assert plant.client.get("/admin/releases", headers=ADMIN).json() == []


def _start_with(plant: Plant, headers: dict[str, str]) -> Any:
    body = {"tenant": "acme", "name": "support", "revision": "r2"}
    return plant.client.post("/admin/releases", json=body, headers=headers)


def test_release_routes_only_on_the_admin_listener(plant: Plant) -> None:
    app = plant.client.app
    public = TestClient(AdminBindGuard(app, admin_port=9999))  # TestClient arrives on port 80
    assert public.get("/admin/releases", headers=ADMIN).status_code == 404
    admin = TestClient(AdminBindGuard(app, admin_port=80))
    assert admin.get("/admin/releases", headers=ADMIN).status_code == 200
    body = {"request_id": "cmpl-x", "rating": "good"}
    key = {"Authorization": f"Bearer {plant.keys['acme']}"}
    wrong_socket = admin.post("/v1/feedback", json=body, headers=key)
    assert wrong_socket.status_code == 404
    assert wrong_socket.json()["error"]["param"] is None  # the guard's 404, not the route's
    assert public.post("/v1/feedback", json=body, headers=key).status_code == 404  # unknown id
    assert public.post("/v1/feedback", json=body, headers=key).json()["error"]["param"] == (
        "request_id"
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"ladder": [0.5, 0.25]}, "ladder"),
        ({"ladder": [0.0]}, "ladder"),
        ({"ladder": []}, "ladder"),
        ({"dwell_s": -1}, "dwell_s"),
        ({"thresholds": {"max_error_rate": 2}}, "max_error_rate"),
        ({"thresholds": {"p99": 2}}, "p99"),
        ({"thresholds": {"min_latency_samples": 0}}, "min_latency_samples"),
        ({"thresholds": {"max_step_s": 0}}, "max_step_s"),
        ({"thresholds": {"max_step_s": float("inf")}}, "max_step_s"),
        ({"thresholds": {"max_ttft_p99_ratio": float("inf")}}, "max_ttft_p99_ratio"),
        ({"thresholds": {"max_tpot_p99_ratio": float("nan")}}, "max_tpot_p99_ratio"),
        ({"dwell_s": float("inf")}, "dwell_s"),
        ({"window_s": 1e300}, "window_s"),  # a hold_until no date can show
        ({"dwell_s": 2592001}, "dwell_s"),
        ({"thresholds": {"max_step_s": 1e300}}, "max_step_s"),
        ({"probes": [{"prompt": "x"}]}, "probes"),
        ({"probes": [{"prompt": "", "expected": "y"}]}, "prompt"),
        ({"share": 0.05}, "share"),
    ],
)
def test_start_validation(plant: Plant, fields: dict[str, Any], param: str) -> None:
    response = _start(plant, **fields)
    assert response.status_code == 400, response.text
    assert param in str(response.json()["error"]["param"])
    assert plant.client.get("/admin/releases", headers=ADMIN).json() == []  # nothing changed


def test_max_step_s_shorter_than_the_dwell_is_refused(plant: Plant) -> None:
    response = _start(plant, dwell_s=600, thresholds={"max_step_s": 60})
    assert response.status_code == 400, response.text
    assert "max_step_s 60.0 is invalid; expected >= dwell_s 600" in response.text
    assert plant.client.get("/admin/releases", headers=ADMIN).json() == []


def test_start_list_status_abort(plant: Plant) -> None:
    thresholds = {"min_requests": 3, "min_latency_samples": 200, "max_step_s": 900}
    started = _start(plant, ladder=[0.1, 0.5], dwell_s=5, thresholds=thresholds, gpu=True)
    assert started.status_code == 201, started.text
    release = started.json()
    assert (release["state"], release["baseline"], release["candidate"]) == ("staged", "r1", "r2")
    assert release["plan"]["ladder"] == [0.1, 0.5]
    assert release["plan"]["thresholds"]["min_requests"] == 3
    assert release["plan"]["thresholds"]["min_latency_samples"] == 200
    assert release["plan"]["thresholds"]["max_step_s"] == 900
    assert release["plan"]["thresholds"]["max_error_rate"] == 0.05  # the default kept
    assert release["plan"]["gpu"] is True
    listed = plant.client.get("/admin/releases", headers=ADMIN).json()
    assert [r["release_id"] for r in listed] == [release["release_id"]]
    again = _start(plant)
    assert again.status_code == 400  # one release per alias at a time
    status = plant.client.get("/admin/releases/acme/support", headers=ADMIN).json()
    assert status["release_id"] == release["release_id"]
    assert (status["comparison"], status["live"]) == (None, None)
    promote = plant.client.post("/admin/releases/acme/support/promote", headers=ADMIN)
    assert promote.status_code == 409  # not before its probes passed
    aborted = plant.client.post("/admin/releases/acme/support/abort", headers=ADMIN)
    assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
    assert plant.client.post("/admin/releases/acme/support/abort", headers=ADMIN).status_code == 409
    assert plant.deps.releases.transitions() == {"aborted": 1}  # the refused ones not counted
    scraped = plant.client.get("/metrics", headers=ADMIN).text
    assert 'loraplex_release_transitions_total{state="aborted"} 1.0' in scraped
    assert 'loraplex_release_transitions_total{state="rolled_back"} 0.0' in scraped
    assert plant.client.get("/admin/releases", headers=ADMIN).json() == []
    finished = plant.client.get("/admin/releases?finished=true", headers=ADMIN).json()
    assert [r["state"] for r in finished] == ["aborted"]
    missing = plant.client.get("/admin/releases/acme/legal", headers=ADMIN)
    assert missing.status_code == 404


def _tick_until(loop: ReleaseLoop, plant: Plant, done: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        loop.run_once()
        plant.clock.advance(0.25)
        status: dict[str, Any] = plant.client.get(
            "/admin/releases/acme/support", headers=ADMIN
        ).json()
        if status["state"] in done:
            return status
        time.sleep(0.01)
    raise AssertionError(f"release stuck in {status['state']}")


def test_failing_probe_rolls_back_before_any_canary_traffic(plant: Plant) -> None:
    traffic = plant.deps.releases
    env = ServeReleaseEnv(OwnedPins(plant.deps.cache), plant.deps.engine, traffic)  # type: ignore[arg-type]
    controller = ReleaseController(plant.registry, env, plant.clock)
    loop = ReleaseLoop(controller.tick, traffic)
    try:
        assert _start(plant, dwell_s=0).status_code == 201
        status = _tick_until(loop, plant, {"rolled_back", "aborted", "canary"})
    finally:
        env.close()
    # The fake engine answers " acme/support@r2 answers.", not r2's expected continuation.
    assert status["state"] == "rolled_back"
    assert "probe" in status["reason"]
    engine: FakeEngine = plant.deps.engine  # type: ignore[assignment]
    probed = [r for r in engine.requests if r.request_id.startswith("probe-")]
    assert probed and all(r.adapter_key is not None for r in probed)
    assert {r.adapter_key.revision for r in probed if r.adapter_key is not None} == {"r2"}
    for user in range(50):
        revision = plant.registry.resolve_revision(
            "acme", "support", f"req-{user}", sticky_key=f"user:u{user}"
        )
        assert revision.revision == "r1"


def test_finished_releases_read_in_bounded_pages(plant: Plant) -> None:
    for _ in range(3):
        assert _start(plant).status_code == 201
        aborted = plant.client.post("/admin/releases/acme/support/abort", headers=ADMIN)
        assert aborted.status_code == 200, aborted.text
    assert _start(plant).status_code == 201  # one in flight

    def listing(**params: Any) -> Any:
        return plant.client.get("/admin/releases", params=params, headers=ADMIN)

    everything = [r["release_id"] for r in listing(finished="true").json()]
    assert len(everything) == 4
    first = listing(finished="true", limit=3).json()
    assert [r["release_id"] for r in first] == everything[:3]
    rest = listing(finished="true", limit=3, after=first[-1]["release_id"]).json()
    assert [r["release_id"] for r in rest] == everything[3:]
    assert listing(finished="true", after=everything[-1]).json() == []
    assert len(listing().json()) == 1  # no paging parameters: the in-flight one, as before
    for params, param in (
        ({"limit": 0}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"after": ""}, "after"),
        ({"after": "r" * 257}, "after"),
        ({"after": "rel-nope"}, "after"),  # names no release: not an empty page
    ):
        reply = listing(finished="true", **params)
        assert reply.status_code == 400, (params, reply.text)
        assert reply.json()["error"]["param"] == param


def test_a_release_stored_before_the_bounds_breaks_no_page(plant: Plant) -> None:
    """A release stored before ``check_plan_bounds`` and ``MAX_PLAN_SECONDS`` (a probe with a
    lone surrogate, an infinite ``window_s``) made every answer holding it fail (a 400 naming
    the serializer's error), the whole page of releases with it. Now it is listed, each such
    value shown safe (U+FFFD, null) and named in ``invalid``; the other releases as they are."""
    ids = []
    for _ in range(3):
        started = _start(plant)
        assert started.status_code == 201, started.text
        ids.append(started.json()["release_id"])
        aborted = plant.client.post("/admin/releases/acme/support/abort", headers=ADMIN)
        assert aborted.status_code == 200, aborted.text
    with plant.registry.db.transaction() as tx:
        for release_id, change in (
            (ids[0], {"window_s": float("inf")}),
            (ids[2], {"probes": [{"prompt": "\ud800x", "expected": "4", "max_tokens": 4,
                                  "differ_from_stable": False}]}),
        ):  # fmt: skip
            row = tx.query_one("SELECT plan FROM releases WHERE release_id = ?", (release_id,))
            assert row is not None
            plan = {**json.loads(row[0]), **change}
            tx.execute(
                "UPDATE releases SET plan = ? WHERE release_id = ?", (json.dumps(plan), release_id)
            )

    def listing(**params: Any) -> Any:
        reply = plant.client.get("/admin/releases", params=params, headers=ADMIN)
        assert reply.status_code == 200, reply.text
        return reply.json()

    everything = listing(finished="true")
    assert [r["release_id"] for r in everything] == ids
    assert everything[0]["plan"]["window_s"] is None
    assert everything[0]["invalid"] == ["plan.window_s: inf is not a finite number; shown as null"]
    assert everything[1]["invalid"] == [] and everything[1]["plan"]["window_s"] == 600.0
    assert everything[2]["plan"]["probes"][0]["prompt"] == "\ufffdx"
    assert [p.split(":")[0] for p in everything[2]["invalid"]] == ["plan.probes[0].prompt"]
    assert [r["release_id"] for r in listing(finished="true", limit=1, after=ids[0])] == ids[1:2]
    status = plant.client.get("/admin/releases/acme/support", headers=ADMIN)
    assert status.status_code == 200 and status.json()["release_id"] == ids[2]


def test_a_start_without_any_probe_says_so(plant: Plant, demo_assets: DemoAssets) -> None:
    """A revision registered without probe_prompt / expected_continuation (the README's own
    adapter) and a plan without probes: probing runs nothing, and the answer says so in
    ``warnings``; it went to canary in silence (newop5)."""
    billing = demo_assets.adapter("acme", "billing", "r1")
    plant.registry.register(RegistrationRequest(billing.path, "acme", "support", "bare"), "test")
    started = _start(plant, revision="bare")
    assert started.status_code == 201, started.text
    [warning] = started.json()["warnings"]
    assert "acme/support@bare has no output probe" in warning and "probes" in warning
    plant.client.post("/admin/releases/acme/support/abort", headers=ADMIN)
    probed = _start(plant, revision="bare", probes=[{"prompt": "hi", "differ_from_stable": True}])
    assert probed.status_code == 201 and probed.json()["warnings"] == []
    plant.client.post("/admin/releases/acme/support/abort", headers=ADMIN)
    own = _start(plant)  # r2 has its own probe
    assert own.status_code == 201 and own.json()["warnings"] == []
