"""Pins, operator warm policies, merge holds and a dedication outlive the engine process: a
restarted child gets them again before any request reaches it (a release's held stable revision
must stay resident; a revision an admin action holds must not be merged meanwhile)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
from live import Live, live_server

from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.warm_policy import WarmPolicy
from loraplex.demo.assets import DemoAssets
from loraplex.engine.standing import StandingSettings
from loraplex.engine.transport.messages import (
    Dedicate,
    Evict,
    HoldMerges,
    Pin,
    Prefetch,
    SetWarm,
    Unpin,
)
from loraplex.engine.transport.process import EngineProcess
from loraplex.errors import EngineUnavailableError
from loraplex.residency.ledger import Tier

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _key(name: str) -> AdapterKey:
    return AdapterKey("b" * 64, "acme", name, "r1", "0" * 64)


def test_standing_settings_follow_pins_unpins_and_warm_policies() -> None:
    standing = StandingSettings()
    a, b = _key("a"), _key("b")
    for command in (
        Pin(a, Tier.L1),
        Pin(a, Tier.L0),
        Pin(b, Tier.L1),
        Unpin(a, Tier.L0),
        Prefetch(b, Tier.L0),  # holds nothing across a restart
        Evict(b, Tier.L2),
        SetWarm(a, WarmPolicy.CPU),
        SetWarm(b, WarmPolicy.ON_DEMAND),
        SetWarm(b, None),  # back to automatic: nothing to replay
    ):
        standing.record(command)
    assert standing.pins() == {a: frozenset({Tier.L1}), b: frozenset({Tier.L1})}
    assert standing.replay() == [
        SetWarm(a, WarmPolicy.CPU),
        Pin(a, Tier.L1),
        Pin(b, Tier.L1),
    ]
    standing.record(Unpin(b, Tier.L1))
    standing.record(Unpin(b, Tier.L1))  # twice: still nothing, no error
    assert standing.pins() == {a: frozenset({Tier.L1})}


def test_standing_holds_nest_and_a_release_counts_even_unanswered() -> None:
    standing = StandingSettings()
    a, b = "acme/support@r1", "acme/support@r2"
    for command in (
        HoldMerges(frozenset({a, b}), hold=True),
        HoldMerges(frozenset({a}), hold=True),  # nested: two on a
        Dedicate(b),
    ):
        standing.record(command)
    standing.withdraw(HoldMerges(frozenset({b}), hold=False))  # noted before it is sent
    standing.record(HoldMerges(frozenset({b}), hold=False))  # answered too: nothing more
    assert standing.holds() == {a: 2}
    assert standing.replay() == [
        HoldMerges(frozenset({a}), hold=True),
        HoldMerges(frozenset({a}), hold=True),
        Dedicate(b),
    ]
    standing.withdraw(HoldMerges(frozenset({a, b}), hold=False))  # b: already none, no error
    standing.withdraw(Dedicate(None))
    standing.withdraw(Pin(_key("a"), Tier.L1))  # not a withdrawal: nothing
    assert standing.replay() == [HoldMerges(frozenset({a}), hold=True)]


def _wait(predicate: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_pin_holds_again_after_the_engine_process_restarts(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    adapter = demo_assets.adapters[1]
    ref = f"{adapter.tenant}/{adapter.name}@{adapter.revision}"
    with live_server(demo_assets, tmp_path, admin_key=ADMIN) as live:
        engine = live.server.engine
        assert isinstance(engine, EngineProcess)
        http = httpx.Client(base_url=live.url, timeout=30)
        pin = {"model": ref, "tier": "L1", "wait": True}
        assert http.post("/admin/residency/pin", json=pin, headers=AUTH).json()["status"] == (
            "resident"
        )

        def pinned_in_l1() -> bool:
            entries = http.get("/admin/residency", headers=AUTH).json()["entries"]
            return any(e["model"] == ref and e["tier"] == "L1" and e["pinned"] for e in entries)

        assert pinned_in_l1()
        dead = engine.pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        _wait(lambda: engine.pid != dead and http.get("/ready").status_code == 200, "no restart")
        _wait(pinned_in_l1, f"{ref} is not pinned in L1 in the restarted engine")

        unpin = {"model": ref, "tier": "L1"}
        assert http.post("/admin/residency/unpin", json=unpin, headers=AUTH).is_success
        assert not pinned_in_l1()


MERGED = "acme/support@r2"  # ``merged:<ref>`` below; the alias points at r1


def _complete(live: Live, model: str, max_tokens: int = 8) -> None:
    reply = httpx.post(
        f"{live.url}/v1/completions",
        json={"model": model, "prompt": "The acme support team", "max_tokens": max_tokens,
              "temperature": 0, "ignore_eos": True},
        headers={"Authorization": f"Bearer {live.key('acme')}"},
        timeout=120,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text


def _kill_and_await_restart(live: Live, engine: EngineProcess, while_down: object) -> None:
    """SIGKILLs the child, runs ``while_down()`` once the engine reports itself down, and waits
    for the restarted child to be ready."""
    dead = engine.pid
    assert dead is not None
    os.kill(dead, signal.SIGKILL)
    _wait(lambda: not engine.health().up, "the engine never went down")
    while_down()  # type: ignore[operator]
    _wait(
        lambda: engine.pid != dead and httpx.get(f"{live.url}/ready").status_code == 200,
        "no restart",
        timeout_s=300.0,  # a child's build took over a minute on a loaded 2-core machine
    )


def test_merge_holds_hold_again_after_the_engine_process_restarts(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    held = frozenset({MERGED})
    config = {"admin_key": ADMIN, "max_loras": 4, "mode": f"merged:{MERGED}"}
    with live_server(demo_assets, tmp_path, **config) as live:
        engine = live.server.engine
        assert isinstance(engine, EngineProcess)
        holds = engine.merge_holds

        def merged_now() -> bool:  # the child's own answer (a probe hold, dropped at once)
            merged = holds.hold(held)
            holds.release(held)
            return MERGED in merged

        for _ in range(3):  # nested holds, as two admin actions on one revision take
            assert holds.hold(held) == frozenset()
        other = frozenset({"acme/support@r1"})
        holds.hold(other)
        holds.release(other)  # released before the restart: not replayed

        def release_while_down() -> None:
            with contextlib.suppress(EngineUnavailableError):  # raised unless already back
                holds.release(held)

        _kill_and_await_restart(live, engine, release_while_down)
        # The first step naming it asks for a lease, and a later step merges once it is granted
        # (maybe in the next request): unheld, it is merged by the end of the second.
        for _ in range(3):
            _complete(live, "support@r2")
        assert not merged_now(), "the restarted engine merged a held revision"
        holds.release(held)
        for _ in range(2):
            _complete(live, "support@r2")
        assert not merged_now(), "a nested hold was not replayed"
        holds.release(held)  # the last one (the one released while down is not replayed)

        def merges() -> bool:
            _complete(live, "support@r2")
            return merged_now()

        _wait(merges, f"{MERGED} was never merged once its holds were released")


def test_a_dedication_holds_again_after_the_engine_process_restarts(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """``auto`` alone never merges the dedicated revision here: it has about a quarter of the
    tokens, behind another revision (which ``auto`` may merge, then dwell on)."""
    with live_server(demo_assets, tmp_path, admin_key=ADMIN, max_loras=4, mode="auto") as live:
        engine = live.server.engine
        assert isinstance(engine, EngineProcess)
        engine.call(Dedicate(MERGED))  # what a fleet's topology asks (docs/modes.md)
        _kill_and_await_restart(live, engine, lambda: None)

        def dedicated_merged() -> bool:
            _complete(live, "support@r1", max_tokens=32)
            _complete(live, "support@r2")
            return MERGED in engine.load_snapshot().merged_revisions

        _wait(dedicated_merged, "the restarted engine did not follow its dedication")
        engine.call(Dedicate(None))
