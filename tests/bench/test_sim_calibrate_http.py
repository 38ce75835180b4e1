"""``sim calibrate``'s server side against a real ``loraplex serve``: the ``--self`` server, then
the same server reached as ``--url`` would reach it (discovery, throwaway keys revoked), and one
cold load timed by the server's stage counters."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loraplex.bench.sim.calibrate_busy import busy_samples
from loraplex.bench.sim.calibrate_cold import cold_samples, lease_handoffs
from loraplex.bench.sim.calibrate_decode import ENGINE_CLOCK, mix_run
from loraplex.bench.sim.calibrate_loads import into_slots, load_samples
from loraplex.bench.sim.calibrate_prefill import prefill_adapters, prefill_samples
from loraplex.bench.sim.calibrate_run import CalibrateConfig
from loraplex.bench.sim.calibrate_target import remote_target, self_target
from loraplex.bench.sim.calibrate_timeline import log_size, prefill_timings, wait_for_lines
from loraplex.sim.cost_model import LINKS

pytestmark = pytest.mark.slow


def test_remote_discovery_keys_and_a_cold_load(demo_assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert demo_assets.base_model_dir.is_dir()  # generated once per checkout
    asset_dir = Path(__file__).resolve().parents[2] / ".loraplex-assets"
    with self_target(asset_dir, (8, 32), 1, max_loras=4, seed=0) as own:
        assert sorted(a.rank for a in own.adapters) == [8, 32]
        assert own.load_cpu_shared  # the demo server is CPU-only
        admin = {"Authorization": f"Bearer {own.admin_key}"}
        with remote_target(own.url, own.admin_key, max_adapters=8) as remote:
            found = {(a.tenant, a.name, a.revision, a.rank) for a in remote.adapters}
            assert found == {(a.tenant, a.name, a.revision, a.rank) for a in own.adapters}
            assert not remote.load_cpu_shared  # not said (--load-cpu-shared)
            token = remote.keys["calibration"]
            ok = httpx.get(f"{own.url}/v1/models", headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 200
            with httpx.Client(base_url=own.url, headers=admin, timeout=60) as client:
                samples = load_samples(client, remote.adapters[:1])
                copies = cold_samples(client, own, CalibrateConfig(repeats=1), tier="L1")
                # Cold loads alone and beside warm requests decoding and arriving
                # (load_busy_scale); the hand-offs read none of their requests (2, 4 and 48
                # tokens, not 1).
                assert own.request_log is not None
                before = log_size(own.request_log)
                busy = busy_samples(client, own, CalibrateConfig(repeats=1))
                busy_lines = wait_for_lines(own.request_log, before, 4, 2)
                with pytest.raises(ValueError, match="tier"):
                    cold_samples(client, own, CalibrateConfig(repeats=1), tier="L0")
                # The prefill samples' lone requests on the engine's timeline (its request log).
                config = CalibrateConfig(prefill_lengths=(8, 32), overhead_requests=2)
                assert own.request_log is not None
                start = log_size(own.request_log)
                _, _, lone = prefill_samples(client, own, config, front_s=0.0)
                groups = [(a, n) for a in prefill_adapters(own) for n in (8, 32)]
                lines = wait_for_lines(own.request_log, start, 8, config.hop_output_tokens)
                timings = prefill_timings(lines, groups, config.hop_output_tokens)
                # A decode mix's run on the engine's clock (the request log's lines).
                into_slots(client, own.adapters, own.adapters[:1])
                run = mix_run(own, 2, own.adapters[:1], CalibrateConfig(output_tokens=4), 0)
        # The run's key no longer authenticates.
        refused = httpx.get(f"{own.url}/v1/models", headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 401
    assert {s.link for s in samples} == set(LINKS)
    assert len(busy) == 2 and all(s.lone_s > 0 and s.busy_s > 0 for s in busy)
    cold_lines = [x for x in busy_lines if x["output_tokens"] == 2]
    assert len(cold_lines) == 4 and {x["tier"] for x in cold_lines} == {"L3"}
    assert {x["output_tokens"] for x in busy_lines} == {2, 4, 48}
    assert lease_handoffs(busy_lines) is None  # no line of 1 token among them
    assert all(s.nbytes > 0 and s.seconds > 0 for s in samples)
    # Only in CPU memory: each request's load is the copy into a slot alone, timed by its stage.
    assert {s.tier for s in copies} == {"L1"} and len(copies) == 2
    assert all(s.stage_s > 0 and s.cold_ttft_s > 0 and s.warm_ttft_s > 0 for s in copies)
    # Every lone request's first step is in the log, shorter than its TTFT.
    assert [(t.adapter, t.prompt_tokens) for t in timings] == groups
    assert all(len(t.steps_s) == 2 and all(0 < v < 1 for v in t.steps_s) for t in timings)
    assert len(lone) == 8
    assert max(v for t in timings for v in t.steps_s) < max(ttft for _, ttft in lone)
    # Both requests' lines were read: the run is on the engine's clock, the client's kept beside.
    assert run.clock == ENGINE_CLOCK and run.tpot_s is not None
    assert len(run.engine_tpots_s) == 2 and all(t > 0 for t in run.engine_tpots_s)
    assert len(run.client_tpots_s) == 2
