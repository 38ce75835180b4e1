"""A release's pins on a real fleet (a local Ray cluster, two engine replicas and the ingress):
the same on every replica, the one Ray Serve starts in place of a killed replica included, and
lifted on every replica when the release ends, one out of rotation at that moment included. And
an operator's pin after the ingress itself was killed and restarted by Ray Serve: a replica
that replaces a killed one afterwards gets it, and its unpin lifts it on every replica.

(A replica that was stopped while a promotion lifted the candidate's prewarm pin kept the pin
for good once it was back, and the replacement of a killed replica got the release's pins only
if the ingress's request router already knew it when the board showed it; a restarted ingress
started with no standing pins: docs/fleet.md.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray")

from fleet_deploy import deployed  # noqa: E402

from loraplex.artifacts.base_model import BaseModelSpec  # noqa: E402
from loraplex.demo.assets import DemoAssets  # noqa: E402
from loraplex.fleet import control  # noqa: E402
from loraplex.fleet.settings import APP_NAME  # noqa: E402

pytestmark = pytest.mark.slow
WAIT_S = 180.0
SETTLE_S = 30.0  # a change on the board that takes longer is not coming


class Fleet:
    def __init__(self, url: str, admin_key: str, r2_key: str, billing_key: str) -> None:
        self.url = url
        self.admin_key = admin_key
        self.r2_key = r2_key  # acme/support@r2: on-demand, so only the release pins it
        self.billing_key = billing_key  # acme/billing@r1: on-demand, so only an operator pins it

    def admin(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def fleet(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory, ray_cluster: None
) -> Iterator[Fleet]:
    with ExitStack() as stack:
        prepared, url = deployed(stack, demo_assets, tmp_path_factory, "fleet-pins", 2, max_loras=4)
        digest = BaseModelSpec.from_dir(demo_assets.base_model_dir).digest
        r2 = demo_assets.adapter("acme", "support", "r2")
        billing = demo_assets.adapter("acme", "billing", "r1")
        yield Fleet(url, prepared.admin_key, str(r2.key(digest)), str(billing.key(digest)))


def _board() -> dict[str, dict[str, Any]]:
    """Every replica's board status, by id."""
    from ray import serve

    board = serve.get_deployment_handle("Board", app_name=APP_NAME)
    entries = board.entries.remote().result(timeout_s=30)
    return {e.replica_id: {**e.status, "healthy": e.healthy} for e in entries}


def _pinned(status: dict[str, Any], key: str) -> bool:
    return key in status["report"]["residency"]["pinned"]


Board = dict[str, dict[str, Any]]  # replica id -> its board status


def _waiter(key: str) -> Callable[[str, Callable[[Board], bool], float], None]:
    """``wait(what, check, timeout_s)``: until ``check(board)``; a failure shows, per replica,
    whether it is healthy and holds ``key`` pinned."""

    def wait(
        what: str, check: Callable[[dict[str, dict[str, Any]]], bool], timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not check(board := _board()):
            if time.monotonic() > deadline:
                seen = {rid: (s["healthy"], _pinned(s, key)) for rid, s in board.items()}
                raise AssertionError(f"not within {timeout_s} s: {what}; (healthy, pinned): {seen}")
            time.sleep(0.5)

    return wait


def _healthy(board: dict[str, dict[str, Any]]) -> list[str]:
    return [rid for rid, s in board.items() if s["healthy"]]


def _kill_engine_replica(replica_id: str) -> None:
    name = f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{replica_id}"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def _replace_one(
    wait: Callable[[str, Callable[[Board], bool], float], None],
) -> tuple[list[str], str]:
    """Kills the first healthy engine replica; the healthy ones before, and the one Ray Serve
    started in its place once it is in rotation."""
    first = _healthy(_board())
    _kill_engine_replica(first[0])
    wait(
        "a replacement in rotation",
        lambda b: len([r for r in _healthy(b) if r not in first]) == 1,
        WAIT_S,
    )
    return first, next(r for r in _healthy(_board()) if r not in first)


def _ingress_actors() -> set[str]:
    prefix = f"SERVE_REPLICA::{APP_NAME}#Ingress#"
    named = ray.util.list_named_actors(all_namespaces=True)
    return {a["name"] for a in named if a["namespace"] == "serve" and a["name"].startswith(prefix)}


def _wait_ingress(fleet: Fleet, replica_id: str, *, healthy: bool) -> None:
    """Until the ingress's view of the board (``/admin/fleet``) has ``replica_id`` so."""
    deadline = time.monotonic() + 30
    with fleet.admin() as admin:
        while True:
            replicas = admin.get("/admin/fleet").json()["replicas"]
            if any(r["replica_id"] == replica_id and r["healthy"] is healthy for r in replicas):
                return
            assert time.monotonic() < deadline, replicas
            time.sleep(0.5)


def _release_state(admin: httpx.Client) -> str:
    reply = admin.get("/admin/releases/acme/support")
    assert reply.status_code == 200, reply.text
    state: str = reply.json()["state"]
    return state


def test_release_pins_are_the_same_on_every_replica_and_lifted_on_every_one(
    fleet: Fleet,
) -> None:
    key = fleet.r2_key
    _wait = _waiter(key)
    _wait("two healthy replicas", lambda b: len(_healthy(b)) == 2, WAIT_S)
    body = {
        "tenant": "acme", "name": "support", "revision": "r2", "ladder": [0.5], "dwell_s": 1.0,
        "auto_promote": False, "thresholds": {"min_requests": 1},
    }  # fmt: skip
    with fleet.admin() as admin:
        started = admin.post("/admin/releases", json=body)
        assert started.status_code == 201, started.text
        deadline = time.monotonic() + WAIT_S
        while (state := _release_state(admin)) != "canary":
            assert state in ("staged", "prewarming", "probing"), state
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
    _wait("r2 pinned on both replicas", lambda b: all(_pinned(s, key) for s in b.values()), 10)

    # A replica dies: Ray Serve starts another, which must hold the release's pins too.
    first, replacement = _replace_one(_wait)
    _wait(
        "r2 pinned on the replacement (the release's pin)",
        lambda b: _pinned(b[replacement], key),
        SETTLE_S,
    )

    # The release ends while the other replica is out of rotation (frozen): the candidate's
    # prewarm pin must still be lifted on it once it is back.
    survivor = first[1]
    pid = _board()[survivor]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # NOTE: as the ingress sees it (its own poll of the board): a call the ingress still
        # sends to the frozen replica waits for it, and holds up Ray's routing of the others.
        _wait_ingress(fleet, survivor, healthy=False)
        with fleet.admin() as admin:
            promoted = admin.post("/admin/releases/acme/support/promote")
            assert promoted.status_code == 200, promoted.text
        _wait("r2 unpinned on the replacement", lambda b: not _pinned(b[replacement], key), 10)
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait("the frozen replica back in rotation", lambda b: b[survivor]["healthy"], 30)
    _wait(
        "r2 unpinned on the replica that was frozen when the release ended",
        lambda b: not _pinned(b[survivor], key),
        SETTLE_S,
    )


def test_an_operators_pin_stands_after_the_ingress_is_restarted(fleet: Fleet) -> None:
    key = fleet.billing_key
    _wait = _waiter(key)
    _wait("two healthy replicas", lambda b: len(_healthy(b)) == 2, WAIT_S)
    body = {"model": "acme/billing@r1", "tier": "L1", "wait": True}
    with fleet.admin() as admin:
        pinned = admin.post("/admin/residency/pin", json=body)
        assert pinned.status_code == 200, pinned.text
    # NOTE: healthy ones: a replica the test above killed may still be on the board (stale)
    _wait(
        "billing pinned on both replicas",
        lambda b: all(_pinned(b[r], key) for r in _healthy(b)),
        10,
    )

    # The ingress dies and Ray Serve starts another: the standing state was in its memory.
    (ingress,) = _ingress_actors()
    ray.kill(ray.get_actor(ingress, namespace="serve"), no_restart=True)
    deadline = time.monotonic() + WAIT_S
    while len(restarted := _ingress_actors() - {ingress}) != 1:
        assert time.monotonic() < deadline, f"no new ingress within {WAIT_S} s"
        time.sleep(0.5)
    control.wait_ready(fleet.url, WAIT_S)

    # Then an engine replica dies: its replacement must hold the operator's pin too.
    _, replacement = _replace_one(_wait)
    _wait("billing pinned on the replacement", lambda b: _pinned(b[replacement], key), SETTLE_S)
    assert _ingress_actors() == restarted  # the same new ingress did it

    with fleet.admin() as admin:
        unpinned = admin.post(
            "/admin/residency/unpin", json={"model": "acme/billing@r1", "tier": "L1"}
        )
        assert unpinned.status_code == 200, unpinned.text
    _wait(
        "billing unpinned on every healthy replica",
        lambda b: not any(_pinned(s, key) for s in b.values() if s["healthy"]),
        SETTLE_S,
    )
