"""``POST /admin/residency/unpin`` says what keeps the copy pinned after it, and a kept
``/admin/residency/evict`` which hold kept it, through the in-process cache and the engine
child's (over its pipe). The unpin answered ``"unpinned"`` while a release's hold or a warm
policy kept the copy pinned (the operator's next ``/v1/unload_lora_adapter`` was a 409 again),
and the evict "kept: pinned, in use or loading"."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from live import live_server

from loraplex.demo.assets import DemoAssets
from loraplex.residency.ledger import Tier
from loraplex.server.pin_owners import RELEASE, OwnedPins

ADMIN = "test-admin-credential-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _unpin(http: httpx.Client, ref: str) -> dict[str, object]:
    reply = http.post("/admin/residency/unpin", json={"model": ref, "tier": "L0"})
    assert reply.status_code == 200, reply.text
    answer: dict[str, object] = reply.json()
    assert (answer["model"], answer["tier"]) == (ref, "L0")  # the fields clients read stay
    return {k: answer[k] for k in ("status", "lifted", "held_by")}


def _pin(http: httpx.Client, ref: str) -> None:
    reply = http.post("/admin/residency/pin", json={"model": ref, "tier": "L0", "wait": True})
    assert reply.status_code == 200, reply.text


def _evict_reason(http: httpx.Client, ref: str) -> object:
    reply = http.post("/admin/residency/evict", json={"model": ref, "tier": "L0"})
    assert reply.status_code == 200 and reply.json()["evicted"] is False, reply.text
    return reply.json()["reason"]


def _warm(http: httpx.Client, ref: str, policy: str) -> None:
    path = "/admin/revisions/" + ref.replace("@", "/")
    reply = http.put(path, json={"warm_policy": policy})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("engine_process", [False, True], ids=["in_thread", "engine_process"])
def test_an_unpin_names_what_still_holds_the_copy(
    demo_assets: DemoAssets, tmp_path: Path, engine_process: bool
) -> None:
    adapter = demo_assets.adapters[0]
    ref = f"{adapter.tenant}/{adapter.name}@{adapter.revision}"
    with (
        live_server(
            demo_assets, tmp_path, admin_key=ADMIN, max_loras=4, engine_process=engine_process
        ) as live,
        httpx.Client(base_url=live.url, headers=AUTH, timeout=60) as http,
    ):
        _pin(http, ref)
        _warm(http, ref, "gpu")
        held = ["warm_policy:gpu (operator)"]
        assert _unpin(http, ref) == {"status": "still_pinned", "lifted": True, "held_by": held}
        assert _unpin(http, ref) == {"status": "still_pinned", "lifted": False, "held_by": held}
        _warm(http, ref, "on_demand")
        assert _unpin(http, ref) == {"status": "not_pinned", "lifted": False, "held_by": []}

        cache = live.server.deps.cache
        assert isinstance(cache, OwnedPins)
        key = live.server.registry.get_revision(ref).key()
        cache.pin(key, Tier.L0, RELEASE).result(timeout=60)  # a release holds its stable
        _pin(http, ref)
        _warm(http, ref, "gpu")
        kept = "kept: pinned by operator, release, warm_policy:gpu (operator)"
        assert _evict_reason(http, ref) == kept
        held = ["release", "warm_policy:gpu (operator)"]
        assert _unpin(http, ref) == {"status": "still_pinned", "lifted": True, "held_by": held}
        _warm(http, ref, "on_demand")
        assert _evict_reason(http, ref) == "kept: pinned by release"
        held = ["release"]
        assert _unpin(http, ref) == {"status": "still_pinned", "lifted": False, "held_by": held}
        cache.unpin(key, Tier.L0, RELEASE)  # the hold's window ended
        assert _unpin(http, ref) == {"status": "not_pinned", "lifted": False, "held_by": []}

        _pin(http, ref)
        assert _unpin(http, ref) == {"status": "unpinned", "lifted": True, "held_by": []}
        unloaded = http.post("/v1/unload_lora_adapter", json={"lora_name": ref})
        assert unloaded.status_code == 200, unloaded.text
