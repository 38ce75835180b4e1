"""A traced request through a two-replica fleet (a real local Ray cluster, the Serve
application as ``loraplex fleet up`` deploys it): one trace in a real OTLP/HTTP receiver holds
the ingress's spans and the replica's engine stages, the replica named."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from otlp_receiver import OtlpReceiver

ray = pytest.importorskip("ray")

from loraplex.demo.assets import DemoAssets  # noqa: E402
from loraplex.fleet import control  # noqa: E402
from loraplex.fleet.settings import FleetSettings  # noqa: E402
from loraplex.serve.assembly import DEMO_DIR  # noqa: E402
from loraplex.serve.config import ServeConfig  # noqa: E402

pytestmark = pytest.mark.slow
WAIT_S = 180.0
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
STAGES = {
    "loraplex.authorization",
    "loraplex.resolution",
    "loraplex.engine",
    "loraplex.queue",
    "loraplex.residency",
    "loraplex.batch",
}

LOAD_STAGES = ("fetch", "verify", "read", "copy")  # remote -> verified -> decoded -> GPU slot


def _wait_replicas(url: str, admin_key: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    headers = {"Authorization": f"Bearer {admin_key}"}
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/admin/fleet", headers=headers, timeout=60).json()
        if sum(1 for r in state["replicas"] if r["healthy"]) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} healthy replicas after {WAIT_S} s")


@pytest.fixture(scope="module")
def fleet_and_receiver(
    demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory, ray_cluster: None
) -> Iterator[tuple[str, dict[str, str], OtlpReceiver]]:
    data_dir: Path = tmp_path_factory.mktemp("fleet-traces")
    (data_dir / DEMO_DIR).symlink_to(demo_assets.root, target_is_directory=True)
    with ExitStack() as stack:
        receiver = stack.enter_context(OtlpReceiver())
        from ray import serve

        stack.callback(serve.shutdown)
        config = ServeConfig(
            data_dir=data_dir, port=control.free_port(), max_loras=4, max_num_seqs=2,
            torch_threads=1, auto_warm=False, trace_endpoint=receiver.url,
            trace_sample_ratio=1.0,
        )  # fmt: skip
        prepared = control.prepare(config)
        settings = FleetSettings(serve=config, model_dir=prepared.model_dir, engine_replicas=2)
        control.deploy(settings)
        url = control.base_url(config)
        control.wait_ready(url, WAIT_S)
        _wait_replicas(url, prepared.admin_key, 2)
        yield url, prepared.sample_keys, receiver


def test_one_trace_spans_the_ingress_and_the_replica(
    fleet_and_receiver: tuple[str, dict[str, str], OtlpReceiver],
) -> None:
    url, keys, receiver = fleet_and_receiver
    headers = {
        "Authorization": f"Bearer {keys['acme']}",
        "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    }
    # acme's billing adapter: no warm policy (the demo keeps support warm in host memory), so
    # on a fresh fleet the request pays every load stage and the trace shows each one
    # ignore_eos: exactly 5 tokens (a sampled EOS at token 4 once made the counts below 4)
    payload = {"model": "billing", "prompt": "The acme billing team", "max_tokens": 5,
               "ignore_eos": True}  # fmt: skip
    reply = httpx.post(f"{url}/v1/completions", json=payload, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    # The ingress's batch processor exports within its schedule delay (5 s by default).
    spans = receiver.wait_for(
        lambda s: any(x.trace_id == CALLER_TRACE and x.name == "loraplex.engine" for x in s),
        timeout_s=60,
    )
    mine = [s for s in spans if s.trace_id == CALLER_TRACE]
    names = {s.name for s in mine}
    assert names >= STAGES, sorted(names)
    assert names >= {f"loraplex.load.{s}" for s in LOAD_STAGES}, sorted(names)
    (root,) = [s for s in mine if s.parent_span_id == CALLER_SPAN]
    ids = {s.span_id for s in mine}
    assert all(s.parent_span_id in ids for s in mine if s is not root)  # one tree
    (engine,) = [s for s in mine if s.name == "loraplex.engine"]
    assert engine.attributes["loraplex.replica.id"]  # the replica that ran it
    assert root.attributes["gen_ai.usage.output_tokens"] == 5
    assert root.attributes["loraplex.trace.kept_by"] == "parent"
    # the residency decision, KV reuse, batches and the acceptance result, as on one server
    assert engine.attributes["loraplex.residency.placement"] == "loaded"
    assert engine.attributes["loraplex.adapter.tier"] == "L3"  # fetched: nothing cached yet
    assert engine.attributes["loraplex.kv.prefix_reused_tokens"] == 0
    batch = [s.attributes for s in mine if s.name == "loraplex.batch"]
    assert sum(b["loraplex.batch.steps"] for b in batch) == 5
    assert all(b["loraplex.batch.kernel_strategy"] in {"masked", "grouped", "loop"} for b in batch)
    assert root.attributes["loraplex.release.verdict"] == "ok"
    assert "acme" not in " ".join(str(v) for s in mine for v in s.attributes.values())
