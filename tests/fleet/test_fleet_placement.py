"""A real fleet places revisions by its replicas' deployment ranks, not by Ray's random ids
(``routing.PlacementNames``; docs/fleet.md, "Placement identity"): on a local Ray cluster, two
deployments of the same two-replica fleet (new replica ids each time) send each of the demo's
five revisions, resident nowhere, to the replica of the same rank; and a killed replica's
replacement (a new id) takes the rank it replaces.

Where a revision went is read off ``/admin/fleet``: the replica whose GPU slots (L0) gained a
copy, and the ``placement`` it shows (its rank's name).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray_cluster import deploy_fleet

ray = pytest.importorskip("ray")

from loraplex.demo.assets import DemoAssets  # noqa: E402
from loraplex.fleet.ray_cluster import free_port  # noqa: E402
from loraplex.fleet.settings import APP_NAME, DEFAULT_REPORT_PERIOD_S  # noqa: E402
from loraplex.serve.assembly import DEMO_DIR  # noqa: E402
from loraplex.serve.config import ServeConfig  # noqa: E402

pytestmark = pytest.mark.slow
WAIT_S = 180.0
REPLICAS = 2
MODELS = ("support@r1", "support@r2", "billing", "legal", "triage")  # acme's five revisions


@dataclass(frozen=True)
class Fleet:
    url: str
    admin_key: str
    tenant_key: str

    def replicas(self) -> list[dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        reply = httpx.get(f"{self.url}/admin/fleet", headers=headers, timeout=60)
        assert reply.status_code == 200, reply.text
        replicas: list[dict[str, Any]] = reply.json()["replicas"]
        return replicas


@contextmanager
def _deployed(demo_assets: DemoAssets, data_dir: Path) -> Iterator[Fleet]:
    (data_dir / DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    with ExitStack() as stack:
        from ray import serve

        stack.callback(serve.shutdown)
        # slots for all five revisions: none is evicted, so each stays where it was placed
        config = ServeConfig(
            data_dir=data_dir, port=free_port(), max_loras=8, max_num_seqs=2,
            torch_threads=1, auto_warm=False,
        )  # fmt: skip
        url, prepared = deploy_fleet(config, REPLICAS, WAIT_S)
        yield Fleet(url, prepared.admin_key, prepared.sample_keys["acme"])


def _wait_ranked(fleet: Fleet, exclude: frozenset[str] = frozenset()) -> dict[str, str]:
    """Replica id -> placement once ``REPLICAS`` healthy replicas outside ``exclude`` show
    distinct ranks; then long enough for the router to hold a report of each with its rank."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ranked = {
            r["replica_id"]: r["placement"]
            for r in fleet.replicas()
            if r["healthy"] and r["placement"] is not None and r["replica_id"] not in exclude
        }
        if len(ranked) == REPLICAS and len(set(ranked.values())) == REPLICAS:
            time.sleep(4 * DEFAULT_REPORT_PERIOD_S)
            return ranked
        time.sleep(0.5)
    raise AssertionError(f"not {REPLICAS} healthy ranked replicas after {WAIT_S} s")


def _placements(fleet: Fleet) -> dict[str, str]:
    """Each revision, asked once in turn on an idle fleet -> the placement of the replica
    whose GPU slots gained it."""
    headers = {"Authorization": f"Bearer {fleet.tenant_key}"}
    placed: dict[str, str] = {}
    for n, model in enumerate(MODELS, start=1):
        payload = {"model": model, "prompt": "The acme", "max_tokens": 2, "temperature": 0}
        reply = httpx.post(
            f"{fleet.url}/v1/completions", json=payload, headers=headers, timeout=120
        )
        assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + WAIT_S
        while True:  # the boards' statuses (pushed every 0.5 s) show the new copy
            replicas = fleet.replicas()
            if sum(r["tiers"]["l0"]["count"] for r in replicas if r["healthy"]) == n:
                break
            assert time.monotonic() < deadline, replicas
            time.sleep(0.25)
        counts = {r["placement"]: r["tiers"]["l0"]["count"] for r in replicas if r["healthy"]}
        [gained] = [p for p, c in counts.items() if c > list(placed.values()).count(p)]
        placed[model] = gained
        # the next decision sees reports made after this request ended (no pending load left)
        time.sleep(4 * DEFAULT_REPORT_PERIOD_S)
    return placed


def test_each_revision_lands_on_the_same_rank_in_two_deployments_and_a_replacement_keeps_its_rank(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory, ray_cluster: None
) -> None:
    with _deployed(demo_assets, tmp_path_factory.mktemp("placement-1")) as fleet:
        first_ids = _wait_ranked(fleet)
        first = _placements(fleet)
        # a replica killed: Ray starts another (a new id), which takes the rank it replaces
        victim = next(i for i, p in first_ids.items() if p == "rank-1")
        actor = ray.get_actor(
            f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{victim}", namespace="serve"
        )
        ray.kill(actor, no_restart=True)
        rejoined = _wait_ranked(fleet, exclude=frozenset({victim}))
        assert victim not in rejoined and sorted(rejoined.values()) == ["rank-0", "rank-1"]
        survivor = next(i for i, p in first_ids.items() if p == "rank-0")
        assert rejoined[survivor] == "rank-0"
    with _deployed(demo_assets, tmp_path_factory.mktemp("placement-2")) as fleet:
        second_ids = _wait_ranked(fleet)
        second = _placements(fleet)
    assert not set(first_ids) & set(second_ids)  # Ray drew new ids
    assert second == first, (first, second)
