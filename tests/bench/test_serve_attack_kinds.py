"""Issue 25's attacker kinds of ``bench serve``: the per-kind report (ratios, null when undefined,
failures and excused 503s counted), that a stopped engine is always resumed, the process tree,
the run order, and each attack's mechanics against small local servers (never timings)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.bench.proc_tree import cpu_s, engine_child, rss_bytes, tree_cpu_s, tree_rss_bytes
from loraplex.bench.serve.adversarial import ATTACK_KINDS, AdversarialConfig, adversarial_workload
from loraplex.bench.serve.attack_hang import hang_start_s, hold_stopped, stopped
from loraplex.bench.serve.attack_kinds import (
    ISOLATED_KINDS,
    LONG_MAX_TOKENS,
    TOKEN_ID_LENGTH,
    TOKEN_ID_PROMPTS,
    KindPlan,
    KindTarget,
    hold_open,
    long_stream,
    paced,
    token_id_batch,
)
from loraplex.bench.serve.attack_report import kind_metrics, met, ratio
from loraplex.bench.serve.attack_runs import ATTACKS, KindRun, RunCpu, attack_for, kind_run_order
from loraplex.bench.serve.attack_sockets import (
    STUCK_STREAMS,
    half_open_flood,
    stuck_request,
    stuck_streams,
)
from loraplex.bench.serve.attacker import KINDS, AttackPlan, schedule
from loraplex.bench.serve.driver import RequestRecord, ResidencyView
from loraplex.bench.workloads import ScenarioParams
from loraplex.cli import app

TINY = ScenarioParams(duration_s=2.0, rate=6.0, prompt_tokens=8, output_tokens=4, num_adapters=1)
PLAN = KindPlan(4.0, 20.0, 2, 5, 15.0, 10.0, 600, 0)
MIB = 1 << 20


# --- the per-kind report -----------------------------------------------------------------------


def _record(status: int, ttft_s: float | None, tokens: int, error: str | None = None,
            reply_s: float | None = None, t_s: float = 0.0) -> RequestRecord:  # fmt: skip
    return RequestRecord(t_s, "steady-a", "ad0000", "L0", status, ttft_s, None, tokens, "r1",
                         error, reply_s)  # fmt: skip


HANG_TALLY = {"engine_pid": 1, "started_s": 0.5, "stopped_s": 1.0}  # stopped from 0.5 s to 1.5 s


def _run(kind: str, attacked: bool, records: list[RequestRecord], growth: int = 0) -> KindRun:
    label = "attacked" if attacked else "calm"
    tally = ({"held": 32} if kind != "hung-engine" else HANG_TALLY) if attacked else {}
    cpu = RunCpu(server_s=3.0, client_s=1.5, attacker_s=0.7 if attacked else None)
    return KindRun(kind, f"adversarial/{kind}/{label}", attacked, tuple(records), ResidencyView(),
                   growth, tally, cpu)  # fmt: skip


def test_report_counts_failures_at_the_timeout_and_gives_the_ratio() -> None:
    workload = adversarial_workload(0, TINY)
    n, want = len(workload.requests), TINY.output_tokens
    calm = [_record(200, 0.010, want) for _ in range(n)]
    attacked = [_record(0, None, 0, "timeout"), _record(200, 0.02, want - 1),
                _record(503, None, 0, "busy", reply_s=0.004),
                *(_record(200, 0.020, want) for _ in range(n - 3))]  # fmt: skip
    runs = [_run("seat-hog", False, calm), _run("seat-hog", True, attacked, growth=3 * MIB)]
    entry = kind_metrics(runs, workload, timeout_s=60.0)["seat-hog"]
    # A timeout, a cut stream and a 503 (outside hung-engine) are failures.
    assert entry["victim_failed"] == 3 and entry["victim_failed_calm"] == 0
    assert entry["victim_requests"] == n
    assert entry["victim_p99_ttft_ms_attacked"] == 60_000.0  # failures count at the timeout
    assert entry["victim_p99_ttft_ms_calm"] == 10.0
    assert entry["victim_p99_ttft_ratio"] == 6000.0
    assert entry["victim_503"] is None and entry["victim_503_max_ms"] is None
    assert entry["server_rss_growth_mib"] == 3.0 and entry["server_rss_growth_mib_calm"] == 0.0
    assert entry["server_rss_growth_mib_over_calm"] == 3.0
    assert (entry["server_cpu_s"], entry["server_cpu_s_calm"]) == (3.0, 3.0)
    assert (entry["client_cpu_s"], entry["client_cpu_s_calm"]) == (1.5, 1.5)
    assert entry["attacker_cpu_s"] == 0.7  # the attack's own process (calm runs have none)
    assert entry["met"] is False
    assert entry["attacker"] == [{"held": 32}]


def test_undefined_ratio_is_null_never_zero() -> None:
    workload = adversarial_workload(0, TINY)
    want = TINY.output_tokens
    served = [_record(200, 0.010, want) for _ in workload.requests]
    alone = kind_metrics([_run("fanout", True, served)], workload, 60.0)["fanout"]
    assert alone["victim_p99_ttft_ms_calm"] is None
    assert alone["victim_p99_ttft_ratio"] is None and alone["met"] is None
    zero = [_record(200, 0.0, want) for _ in workload.requests]  # calm P99 of 0 ms
    runs = [_run("fanout", False, zero), _run("fanout", True, served)]
    assert kind_metrics(runs, workload, 60.0)["fanout"]["victim_p99_ttft_ratio"] is None
    assert ratio(None, 5.0) is None and ratio(5.0, None) is None and ratio(3.0, 2.0) == 1.5


def test_hung_engine_reports_503s_apart_with_their_slowest_latency() -> None:
    workload = adversarial_workload(0, TINY)
    n, want = len(workload.requests), TINY.output_tokens
    calm = [_record(200, 0.010, want) for _ in range(n)]
    attacked = [_record(503, None, 0, "engine hung", reply_s=0.2),
                _record(503, None, 0, "engine hung", reply_s=1.7),
                *(_record(200, 0.011, want) for _ in range(n - 2))]  # fmt: skip
    runs = [_run("hung-engine", True, attacked), _run("hung-engine", False, calm)]
    entry = kind_metrics(runs, workload, 60.0)["hung-engine"]
    assert entry["victim_failed"] == 0 and entry["victim_503"] == 2
    assert entry["victim_503_calm"] == 0 and entry["victim_requests"] == n
    assert entry["victim_503_max_ms"] == 1700.0
    assert entry["victim_p99_ttft_ms_attacked"] == 11.0  # the 503s are not in the percentile
    assert entry["victim_p99_ttft_ratio"] == 1.1
    assert entry["met"] is False  # one 503 took longer than 1 s
    fast = [_record(503, None, 0, "engine hung", reply_s=0.2), *attacked[2:], attacked[2]]
    runs = [_run("hung-engine", True, fast), _run("hung-engine", False, calm)]
    assert kind_metrics(runs, workload, 60.0)["hung-engine"]["met"] is True


def test_hung_engine_excuses_only_503s_in_flight_during_the_stop_of_an_attacked_run() -> None:
    """The stop is 0.5 s to 1.5 s (``HANG_TALLY``), widened by 1 s: a 503 to a request that
    ended before -0.5 s or arrived after 2.5 s, or any 503 in the calm run, is a failure."""
    workload = adversarial_workload(0, TINY)
    n, want = len(workload.requests), TINY.output_tokens
    busy = _record(503, None, 0, "engine hung", reply_s=0.1, t_s=0.0)  # in flight at -0.5 s+
    late = _record(503, None, 0, "engine hung", reply_s=0.1, t_s=2.6)  # after the window
    during = _record(503, None, 0, "engine hung", reply_s=0.3, t_s=1.0)
    served = [_record(200, 0.011, want) for _ in range(n - 2)]
    runs = [_run("hung-engine", True, [busy, during, *served]),
            _run("hung-engine", False, [busy, late, *served])]  # fmt: skip
    entry = kind_metrics(runs, workload, 60.0)["hung-engine"]
    assert entry["victim_503"] == 2 and entry["victim_failed"] == 0
    assert entry["victim_503_calm"] == 0 and entry["victim_failed_calm"] == 2
    runs = [_run("hung-engine", True, [late, during, *served])]
    entry = kind_metrics(runs, workload, 60.0)["hung-engine"]
    assert entry["victim_503"] == 1 and entry["victim_failed"] == 1 and entry["met"] is False


def test_stuck_stream_is_judged_on_memory_growth() -> None:
    workload = adversarial_workload(0, TINY)
    served = [_record(200, 0.010, TINY.output_tokens) for _ in workload.requests]
    for growth, want in ((140 * MIB, False), (70 * MIB, True)):  # the calm run grew 60 MiB
        runs = [_run("stuck-stream", False, served, 60 * MIB),
                _run("stuck-stream", True, served, growth)]  # fmt: skip
        assert kind_metrics(runs, workload, 60.0)["stuck-stream"]["met"] is want
    assert met([True, None]) is None and met([None, False]) is False and met([True]) is True


def test_half_open_flood_is_undefined_unless_the_flood_held_the_budget_full() -> None:
    workload = adversarial_workload(0, TINY)
    served = [_record(200, 0.010, TINY.output_tokens) for _ in workload.requests]
    for peak, delivered, want in ((511, False, None), (512, True, True)):
        attacked = _run("half-open-flood", True, served)
        attacked = replace(attacked, attacker={"sockets": 1100, "peak_open": peak})
        runs = [_run("half-open-flood", False, served), attacked]
        entry = kind_metrics(runs, workload, 60.0)["half-open-flood"]
        assert (entry["attack_delivered"], entry["met"]) == (delivered, want)


def test_cli_refuses_an_unknown_attacker_priority() -> None:
    args = ["bench", "serve", "--scenarios", "adversarial", "--attacker-priority", "low"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "attacker_priority" in result.output


def test_kinds_keep_their_run_order_and_pool_rounds() -> None:
    workload = adversarial_workload(0, TINY)
    served = [_record(200, 0.010, TINY.output_tokens) for _ in workload.requests]
    runs = [_run("fanout", True, served), _run("fanout", False, served),
            _run("seat-hog", False, served), _run("seat-hog", True, served),
            _run("fanout", False, served), _run("fanout", True, served)]  # fmt: skip
    metrics = kind_metrics(runs, workload, 60.0)
    assert list(metrics) == ["fanout", "seat-hog"]
    assert metrics["fanout"]["victim_requests"] == 2 * len(workload.requests)
    assert len(metrics["fanout"]["attacker"]) == 2
    json.dumps(metrics)  # the JSON line holds it as is


# --- a stopped engine is always resumed --------------------------------------------------------


def test_stopped_sends_sigcont_when_the_block_raises() -> None:
    sent: list[tuple[int, int]] = []
    with pytest.raises(RuntimeError), stopped(42, lambda pid, sig: sent.append((pid, sig))):
        raise RuntimeError("the run failed")
    assert sent == [(42, signal.SIGSTOP), (42, signal.SIGCONT)]


def test_stopped_tolerates_a_process_that_died_meanwhile() -> None:
    sent: list[int] = []

    def send(pid: int, sig: int) -> None:
        sent.append(sig)
        if sig == signal.SIGCONT:
            raise ProcessLookupError(pid)

    with stopped(7, send):
        pass
    assert sent == [signal.SIGSTOP, signal.SIGCONT]


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_cancelled_hang_resumes_the_real_process(sleeper: subprocess.Popen[bytes]) -> None:
    async def cancel_midway() -> str:
        task = asyncio.create_task(hold_stopped(sleeper.pid, 60.0))
        deadline = time.monotonic() + 10
        while _state(sleeper.pid) != "T" and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        during = _state(sleeper.pid)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return during

    assert asyncio.run(cancel_midway()) == "T"
    deadline = time.monotonic() + 10
    while _state(sleeper.pid) == "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _state(sleeper.pid) != "T"


def test_the_hang_starts_within_the_trace() -> None:
    assert hang_start_s(20.0) == 2.0 and hang_start_s(4.0) == 1.0


# --- the server's process tree -----------------------------------------------------------------

_SPAWNS = """
import multiprocessing as mp, sys, time
if __name__ == "__main__":
    child = mp.get_context("spawn").Process(target=time.sleep, args=(60,), daemon=True)
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_engine_child_is_the_spawned_child_and_the_tree_counts_it(tmp_path: Path) -> None:
    script = tmp_path / "spawns.py"
    script.write_text(_SPAWNS)
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        child = int(process.stdout.readline())
        # ``start()`` may return before the child shows its spawn command line (CI, loaded, once
        # found no engine child): look again until it does, at most 30 s, then the real check
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if engine_child(process.pid) == child:
                    break
            except RuntimeError:
                pass
            time.sleep(0.01)
        assert engine_child(process.pid) == child, Path(f"/proc/{child}/cmdline").read_bytes()
        assert tree_rss_bytes(process.pid) >= rss_bytes(process.pid) + rss_bytes(child) > 0
    finally:
        process.kill()
        process.wait()
    with pytest.raises(RuntimeError, match="expected exactly one engine process"):
        engine_child(os.getpid())


_FORKS_AN_ENGINE = """
import os, sys, time
from pathlib import Path
from loraplex.engine.transport.process_child import ENGINE_PROCESS_NAME
pid = os.fork()
if pid == 0:
    Path("/proc/self/comm").write_text(ENGINE_PROCESS_NAME)  # as the engine child names itself
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_engine_child_is_found_by_its_name_when_forked() -> None:
    """``loraplex serve`` forks its first engine process: it shares the server's command line
    and is told apart by its name."""
    process = subprocess.Popen([sys.executable, "-c", _FORKS_AN_ENGINE], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        child = int(process.stdout.readline())
        assert engine_child(process.pid) == child
    finally:
        os.kill(child, 9)
        process.kill()
        process.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_cpu_seconds_of_a_process_grow_with_its_work_and_are_zero_once_gone() -> None:
    before = cpu_s(os.getpid())
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:  # 0.1 s of this process's CPU
        pass
    assert cpu_s(os.getpid()) - before >= 0.05  # /proc counts in clock ticks (10 ms)
    assert tree_cpu_s(os.getpid()) >= cpu_s(os.getpid())
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert cpu_s(process.pid) == 0.0


# --- configuration, order and requests ---------------------------------------------------------


def test_every_kind_has_an_attack_and_unknown_kinds_are_refused() -> None:
    assert tuple(ATTACKS) == ISOLATED_KINDS
    with pytest.raises(ValueError, match="attack kind 'nope'"):
        attack_for("nope")
    assert AdversarialConfig().attack_kinds == ATTACK_KINDS == (*KINDS, *ISOLATED_KINDS)
    for kinds in ((), ("nope",), ("seat-hog", "seat-hog")):
        with pytest.raises(ValueError, match=r"^attack_kinds"):
            AdversarialConfig(attack_kinds=kinds)
    for field in ("flood_sockets", "hang_s"):
        with pytest.raises(ValueError, match=f"^{field} 0 is invalid"):
            AdversarialConfig(**{field: 0})
    config = AdversarialConfig(attack_kinds=("hung-engine", "cancel", "seat-hog", "sampling"))
    assert config.mixed_kinds == ("sampling", "cancel")
    assert config.isolated_kinds == ("seat-hog", "hung-engine")
    assert AdversarialConfig(attack_kinds=("fanout",)).mixed_kinds == ()


def test_cli_refuses_an_unknown_attack_kind() -> None:
    args = ["bench", "serve", "--scenarios", "adversarial", "--attack-kinds", "seat-hog,nope"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "attack_kinds" in result.output


def test_the_mixed_attacker_cycles_only_the_selected_kinds() -> None:
    plan = AttackPlan(4.0, 4.0, 2, 100, "attack0", 10.0, 600, 0, ("sampling", "cancel"))
    assert {r.kind for r in schedule(plan, ())} == {"sampling", "cancel"}
    with pytest.raises(ValueError, match=r"^kinds"):
        AttackPlan(4.0, 4.0, 2, 100, "attack0", 10.0, 600, 0, ("seat-hog",))


def test_each_kinds_pair_alternates_its_order() -> None:
    order = [(r.name, r.attacked) for r in kind_run_order(("seat-hog", "fanout"), 2)]
    assert order == [
        ("adversarial/seat-hog/calm-0", False), ("adversarial/seat-hog/attacked-0", True),
        ("adversarial/fanout/attacked-0", True), ("adversarial/fanout/calm-0", False),
        ("adversarial/seat-hog/attacked-1", True), ("adversarial/seat-hog/calm-1", False),
        ("adversarial/fanout/calm-1", False), ("adversarial/fanout/attacked-1", True),
    ]  # fmt: skip
    assert [r.name for r in kind_run_order(("stuck-stream",), 1)] == [
        "adversarial/stuck-stream/calm", "adversarial/stuck-stream/attacked"
    ]  # fmt: skip


def test_requests_have_issue_25s_sizes() -> None:
    body = json.loads(long_stream(PLAN, 3, n=16).body)
    assert body["max_tokens"] == LONG_MAX_TOKENS == 480 and body["n"] == 16
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["prompt"] == json.loads(long_stream(PLAN, 3).body)["prompt"]  # seeded
    batch = token_id_batch(PLAN)
    prompts = json.loads(batch.body)["prompt"]
    assert len(prompts) == TOKEN_ID_PROMPTS and {len(p) for p in prompts} == {TOKEN_ID_LENGTH}
    assert len(batch.body) < 8 << 20  # under an 8 MiB cap (the derived default is smaller: 413)


# --- the attacks' mechanics against small local servers -----------------------------------------


def test_hold_open_keeps_count_exchanges_open_and_counts_answers() -> None:
    async def main() -> tuple[dict[str, object], int]:
        stop, open_now, peak = asyncio.Event(), 0, 0
        answered = 0

        async def send(index: int) -> tuple[int, str | None]:
            nonlocal open_now, peak, answered
            open_now += 1
            peak = max(peak, open_now)
            await asyncio.sleep(0.001)
            open_now -= 1
            answered += 1
            if answered >= 40:
                stop.set()
            return (200, None) if index % 2 else (429, "busy")

        tally = await hold_open(4, send, stop)
        return tally, peak

    tally, peak = asyncio.run(main())
    assert peak == 4 and tally["held"] == 4
    statuses = tally["statuses"]
    assert isinstance(statuses, dict) and set(statuses) == {"200", "429"}
    assert tally["answered"] == sum(statuses.values()) >= 40


def test_paced_never_exceeds_its_in_flight_bound() -> None:
    async def main() -> tuple[dict[str, object], int]:
        stop, open_now, peak = asyncio.Event(), 0, 0

        async def send() -> tuple[int, str | None]:
            nonlocal open_now, peak
            open_now += 1
            peak = max(peak, open_now)
            await asyncio.sleep(0.05)
            open_now -= 1
            return 400, "too long"

        task = asyncio.create_task(paced(PLAN, send, stop))
        await asyncio.sleep(0.3)
        stop.set()
        return await task, peak

    tally, peak = asyncio.run(main())
    assert 1 <= peak <= PLAN.max_in_flight
    assert isinstance(tally["sent"], int) and tally["sent"] >= 1


async def _serve(handler: object) -> tuple[asyncio.Server, KindTarget]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    return server, KindTarget(f"http://127.0.0.1:{port}", "tenant-key", os.getpid())


def test_half_open_flood_holds_its_sockets_and_reopens_closed_ones() -> None:
    heads: list[bytes] = []

    async def main() -> dict[str, object]:
        async def close_after_head(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            heads.append(await reader.read(4096))
            if len(heads) <= PLAN.flood_sockets:
                writer.close()  # the first ones: closed by the server, reopened by the flood
            else:
                await asyncio.sleep(60)  # the rest: held

        server, target = await _serve(close_after_head)
        stop = asyncio.Event()
        task = asyncio.create_task(half_open_flood(target, PLAN, stop))
        deadline = time.monotonic() + 10
        while len(heads) < 2 * PLAN.flood_sockets and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        tally = await task
        server.close()
        return tally

    tally = asyncio.run(main())
    assert tally["closed_by_server"] == PLAN.flood_sockets
    assert tally["opened"] == 2 * PLAN.flood_sockets
    assert tally["open_at_stop"] == tally["peak_open"] == PLAN.flood_sockets
    head = heads[0]
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n") and not head.endswith(b"\r\n\r\n")
    assert b"authorization" not in head.lower()


def test_stuck_streams_send_an_authenticated_request_and_never_read() -> None:
    received: list[bytes] = []

    async def main() -> dict[str, object]:
        async def answer_a_lot(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.append(await reader.readuntil(b"\r\n\r\n"))
            writer.transport.set_write_buffer_limits(high=1 << 30)
            writer.write(b"x" * (4 << 20))  # far more than the client's window
            await asyncio.sleep(60)

        server, target = await _serve(answer_a_lot)
        stop = asyncio.Event()
        task = asyncio.create_task(stuck_streams(target, PLAN, stop))
        deadline = time.monotonic() + 10
        while len(received) < STUCK_STREAMS and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        tally = await task
        server.close()
        return tally

    tally = asyncio.run(main())
    assert tally["streams"] == STUCK_STREAMS and tally["connect_failed"] == 0
    assert isinstance(tally["rcvbuf_bytes"], int) and tally["rcvbuf_bytes"] <= 64 << 10
    assert all(b"Authorization: Bearer tenant-key" in head for head in received)
    target = KindTarget("http://127.0.0.1:1", "k", 1)
    body = json.loads(stuck_request(target, PLAN, 0).split(b"\r\n\r\n", 1)[1])
    assert body["n"] == 16 and body["logprobs"] == 20 and body["stream"] is True


def test_report_page_has_a_row_per_kind_and_the_json_line_carries_them() -> None:
    from loraplex.bench.serve.report import serve_json_line, serve_markdown

    workload = adversarial_workload(0, TINY)
    served = [_record(200, 0.010, TINY.output_tokens) for _ in workload.requests]
    kinds = kind_metrics([_run("seat-hog", False, served), _run("seat-hog", True, served)],
                         workload, 60.0)  # fmt: skip
    result = {"name": "serve", "config": {}, "seed": 0,
              "metrics": {"adversarial_kinds": kinds, "runs": {}}}  # fmt: skip
    page = serve_markdown(result, "cdf.png", "hits.png")
    assert "| seat-hog | True | 0 | 1.000 |" in page
    line = json.loads(serve_json_line(result))
    assert line["metrics"]["adversarial_kinds"]["seat-hog"]["victim_p99_ttft_ratio"] == 1.0
