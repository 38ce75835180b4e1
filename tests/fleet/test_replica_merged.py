"""A replica in ``merged:<ref>`` mode (docs/modes.md) reports the merged revision's key in its
routing report once merged, and a router prefers it for that revision (reason ``merged``)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import ManualClock
from loraplex.demo.assets import DemoAssets
from loraplex.engine.protocol import EngineRequest
from loraplex.fleet.replica import EngineReplica, build_replica_parts
from loraplex.registry import open_registry
from loraplex.router import Reason, Router, RouteRequest
from loraplex.router.reports import ReplicaReport, Residency, decode_report
from loraplex.sampling import SamplingParams
from loraplex.serve.bootstrap import register_demo
from loraplex.serve.config import ServeConfig
from loraplex.serve.engine_side import registry_config


def test_a_merged_replica_reports_the_merged_key_and_wins_its_requests(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    model_dir = demo_assets.base_model_dir
    config = ServeConfig(
        data_dir=tmp_path, model=model_dir, demo=False, max_loras=2,
        mode="merged:acme/support@r1",
    )  # fmt: skip
    registry = open_registry(registry_config(config), base=BaseModelSpec.from_dir(model_dir))
    try:
        register_demo(registry, demo_assets)
    finally:
        registry.close()
    replica = EngineReplica("merged", build_replica_parts(config, model_dir, "merged"))
    try:
        key = demo_assets.adapter("acme", "support", "r1").key(demo_assets.base_digest)
        assert replica.routing_report().residency.merged == frozenset()
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        request = EngineRequest("m-1", "acme", key, (1, 5, 6, 7), params)

        async def run() -> None:
            async for _ in replica.generate(request):
                pass

        asyncio.run(run())
        report = decode_report(replica.routing_stats()["report"])
        assert report.residency.merged == frozenset({str(key)})
        assert str(key) in report.residency.l0
    finally:
        replica.close()
    merged = replace(report, at_s=0.0)  # the router restamps reports on its own clock
    plain = ReplicaReport("plain", 0.0, Residency(l0=frozenset({str(key)})), report.load)
    router = Router("affinity_until_saturated", clock=ManualClock(), rng=random.Random(0))
    decision = router.choose(RouteRequest(str(key), None, 4), {"plain": plain, "merged": merged})
    assert (decision.replica_id, decision.reason) == ("merged", Reason.MERGED)
