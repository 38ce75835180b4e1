"""``scripts/sim-timeline/offline_fleet.py``, ``offline.py`` and ``refit_fleet.py`` run to the
end against stored lines of ``docs/benchmarks/sim-runs.jsonl`` and stored cost files (they hand
``simulated`` a pricing, ``bench.priced``, not a cost model: after ``simulated`` took a pricing
callable all three failed with "'CostModel' object is not callable")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from loraplex.bench.sim.config import SimBenchConfig

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "sim-timeline"
# a calibration the fit check holds (SIMCAL2; docs/simulator.md, SIMCOLD)
COST = "docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-both20.json"
LINE = "57"  # a bench sim line with both targets, 64 requests a trace


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, *args]
    done = subprocess.run(
        command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_offline_fleet_prints_the_fleet_errors_of_each_variant() -> None:
    out = _run(str(SCRIPTS / "offline_fleet.py"), LINE, f"{COST}:none").splitlines()
    assert len(out) == 1 and out[0].startswith(f"{COST}:none line {LINE}: ")
    assert "ttft_p50_rel_error" in out[0] and "'zipf-longtail'" in out[0]


def test_offline_prints_the_single_errors_of_each_cost_file() -> None:
    out = _run(str(SCRIPTS / "offline.py"), "--lines", LINE, "--cost", COST).splitlines()
    assert len(out) == 1 and out[0].startswith(f"{Path(COST).name} line {LINE}: hit ")


def test_refit_fleet_prints_the_refitted_curve_and_the_fleet_errors() -> None:
    out = _run(str(SCRIPTS / "refit_fleet.py"), "spread4", "47").splitlines()
    assert out[1].startswith("fitted ") and out[2].startswith("errors ")
    assert len(out) == 6  # and one line per trace


def test_robust_passes_names_the_disturbed_pass_and_writes_each_model(tmp_path: Path) -> None:
    """SIMCAL's hold 3 (line 53): pass 0's prefill price fitted to 0 is left out (SIMBOTH)."""
    passes = "docs/benchmarks/sim-cost-cpu-2core-demo-small-2026-12-05-simcal3-passes.json"
    out = _run(str(SCRIPTS / "robust_passes.py"), "53", passes, str(tmp_path)).splitlines()
    assert out[0] == "line 53: disturbed {0: 'per_prefill_token_s fitted to 0'}, kept [1, 2, 3]"
    assert sum(line.startswith(("every pass, ", "rule, ")) for line in out) == 4
    written = sorted(p.name for p in tmp_path.iterdir())
    assert "rule-adjacent-zipf-longtail.json" in written and "every-pass-merged.json" in written
    assert len(written) == 8  # merged and one per trace, with and without the rule


def test_busy_loads_reads_what_ran_beside_each_cold_load() -> None:
    """``busy_loads.beside``: a cold load's window (asked -> ready) against the other requests'
    service (first plan -> end): the time-averaged number served, the busy fraction, those
    served at its start (what the simulator reads) and the prefills in it."""
    sys.path.insert(0, str(SCRIPTS))
    from busy_loads import beside

    def line(t: float, tier: str, **engine: float) -> dict[str, object]:
        return {"t_s": t, "tier": tier, "engine": engine}

    lines = [
        line(0.0, "L3", asked_s=0.0, load_s=0.008, ready_s=0.010, scheduled_s=0.010, end_s=0.05),
        # served from 0.005 to 0.030 (first step ended at 0.008): half the window, one prefill
        line(0.004, "L0", scheduled_s=0.001, first_step_end_s=0.004, end_s=0.026),
        line(0.5, "L0", scheduled_s=0.001, first_step_end_s=0.004, end_s=0.02),  # after it
    ]
    row = beside(lines, 0)
    assert row is not None
    assert row["mean_running"] == 0.5 and row["busy_fraction"] == 0.5
    assert row["running_at_start"] == 0 and row["prefills"] == 1
    assert beside(lines, 1) is None  # a warm request loads nothing


def _logs_dir(root: Path, trace: str, trace_requests: int) -> int:
    """A ``bench sim --logs-dir`` of one single and one fleet run of ``trace``, as the real
    runs write them (every 4th request cold, the rest warm; fixed stage stamps); its requests."""
    config = SimBenchConfig(traces=(trace,), trace_requests=trace_requests, scale=None)
    (workload,) = config.workloads()
    engine = {"asked_s": 0.001, "load_s": 0.004, "ready_s": 0.006, "lease_s": 0.007,
              "scheduled_s": 0.008, "first_step_end_s": 0.02, "end_s": 0.05}  # fmt: skip
    files: dict[str, list[dict[str, object]]] = {}
    for i, r in enumerate(workload.requests):
        tier = "L3" if i % 4 == 0 else "L0"
        line = {"t_s": r.t_s, "tenant": r.tenant, "adapter": f"{r.adapter}@v1", "tier": tier,
                "ttft_s": 0.021, "engine": engine, "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens}  # fmt: skip
        files.setdefault(f"single-r0-{trace}.requests.jsonl", []).append(line)
        files.setdefault(f"single-r0-{trace}.client.jsonl", []).append(
            {"tier": tier, "ttft_s": 0.025}
        )
        files.setdefault(f"fleet-r0-{trace}.client.jsonl", []).append(
            {"tenant": r.tenant, "tier": tier, "ttft_s": 0.03}
        )
    for name, rows in files.items():
        (root / name).write_text("".join(json.dumps(x) + "\n" for x in rows), encoding="utf-8")
    return len(workload.requests)


def test_logs_and_fleet_pairs_pair_each_logged_run_with_its_simulation(tmp_path: Path) -> None:
    """``logs.py`` (single) and ``fleet_pairs.py`` (fleet) share ``logs.logged_runs``: the
    logged runs, their traces, sizes and simulator config (fleet_pairs repeated the set-up)."""
    n = _logs_dir(tmp_path, "hot-burst", 16)
    args = ["--logs-dir", str(tmp_path), "--cost-model", COST, "--trace-requests", "16"]
    (single,) = _run(str(SCRIPTS / "logs.py"), *args).splitlines()
    name, _, body = single.partition(" ")
    assert name == "single-r0-hot-burst"
    tiers = json.loads(body)
    assert set(tiers) == {"L0", "L3"}
    assert tiers["L0"]["n"] + tiers["L3"]["n"] == n and tiers["L0"]["ttft"] == 25.0
    (fleet,) = _run(str(SCRIPTS / "fleet_pairs.py"), *args).splitlines()
    name, _, body = fleet.partition(" ")
    assert name == "fleet-r0-hot-burst"
    pairs = json.loads(body)
    assert sum(pairs["tiers"].values()) == n and sum(pairs["sim_reasons"].values()) == n
    assert {k.split("/")[0] for k in pairs["tiers"]} == {"L0", "L3"}


def _decisions_run(
    tmp_path: Path, ids: list[str], mark: dict[str, str], driver: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``fleet_decisions.py`` over a "real" run that is the simulator's own with replicas named
    ``ids`` (its decisions written as the probe logs them, pid 7, with ``mark``; its tiers as
    the client's records); with ``driver``, the driver's own simulator's decisions first (pid
    3, the same with replicas named ``driver`` and each sent to the next replica), which the
    script must leave out."""
    sys.path.insert(0, str(SCRIPTS))
    from fleet_decisions import simulated
    from logs import logged_runs

    from loraplex.sim import cost_model as cost_file

    n = _logs_dir(tmp_path, "zipf-longtail", 24)
    logged = logged_runs(tmp_path, 24, "fleet")
    (run,) = logged.runs
    kept, decisions = simulated(run, logged.values, cost_file.load(REPO / COST), ids, {})
    assert len(kept) == len(decisions) == n
    (tmp_path / "fleet-r0-zipf-longtail.client.jsonl").write_text(
        "".join(
            json.dumps({"tenant": o.tenant, "tier": o.tier, "ttft_s": 0.03}) + "\n" for o in kept
        ),
        encoding="utf-8",
    )
    lines = []
    if driver is not None:
        rename = dict(zip(ids, driver, strict=True))
        for d in decisions:
            replicas = {rename[r]: view for r, view in d["replicas"].items()}
            chosen = driver[(driver.index(rename[d["chosen"]]) + 1) % len(driver)]
            mine = {**d, "chosen": chosen, "replicas": replicas, "pid": 3, "retry": False}
            lines.append(mine | ({"clock": "ManualClock"} if mark else {}))
    lines += [{**d, "pid": 7, "retry": False, **mark} for d in decisions]
    probe = tmp_path / "decisions.jsonl"
    probe.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    args = ["--logs-dir", str(tmp_path), "--decisions", str(probe), "--cost-model", COST]
    command = [sys.executable, str(SCRIPTS / "fleet_decisions.py"), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*command, "--trace-requests", "24"],
        check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _by_label(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-2000:]
    by_label = {}
    for line in done.stdout.splitlines():
        stem, label, body = line.split(" ", 2)
        assert stem == "fleet-r0-zipf-longtail"
        by_label[label] = json.loads(body)
    return by_label


def test_fleet_decisions_lines_a_run_up_with_itself_where_the_ids_match(tmp_path: Path) -> None:
    """A run recorded while the fleet placed by Ray ids (here a, b, c; the probe wrote no clock
    mark then, and the driver's simulator named its replicas ``replica-000``, ..) lines up
    request by request with the simulation given its ids, and not with the simulator's names."""
    old_names = ["replica-000", "replica-001", "replica-002"]
    by_label = _by_label(_decisions_run(tmp_path, ["a", "b", "c"], {}, driver=old_names))
    assert by_label["real_ids"]["causes"] == {} and by_label["real_ids"]["first_divergence"] is None
    assert by_label["real_ids"]["hit_real"] == by_label["real_ids"]["hit_sim"]
    assert by_label["sim_ids"]["causes"]  # the simulator's own names place otherwise


def test_fleet_decisions_reads_a_run_whose_fleet_places_by_rank(tmp_path: Path) -> None:
    """Since the fleet places by rank, its router and the driver's simulator both name replicas
    ``rank-0``, ..: the probe's clock mark tells the driver's decisions from the fleet's (the
    ``replica-`` prefix it read counted them as the fleet's, each sent elsewhere), and the
    simulator's own names are the real ones."""
    ranks = ["rank-0", "rank-1", "rank-2"]
    mark = {"clock": "MonotonicClock"}
    by_label = _by_label(_decisions_run(tmp_path, ranks, mark, driver=ranks))
    for label in ("real_ids", "sim_ids"):
        assert by_label[label]["causes"] == {} and by_label[label]["first_divergence"] is None
        assert by_label[label]["hit_real"] == by_label[label]["hit_sim"]


def test_fleet_decisions_refuses_rank_names_without_the_clock_mark(tmp_path: Path) -> None:
    """A probe file written before the mark, of a run with rank names: the driver's decisions
    cannot be told from the fleet's, so none is read as either."""
    ranks = ["rank-0", "rank-1", "rank-2"]
    done = _decisions_run(tmp_path, ranks, {}, driver=ranks)
    assert done.returncode == 1 and done.stdout == ""
    assert "no clock mark" in done.stderr and "record the run with the current probe" in done.stderr
