"""``bench serve``'s adversarial scenario: the attack schedule, the hostile adapters, the metrics,
the keep-alive probe, and one tiny real run (structure and what the attacker got; never timings).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from local_http import local_server
from typer.testing import CliRunner

from loraplex.bench.serve.adversarial import (
    KEEPALIVE_REQUESTS,
    VICTIMS,
    AdversarialConfig,
    AdversarialRun,
    adversarial_metrics,
    adversarial_workload,
    keepalive_rtts,
    run_adversarial,
    run_order,
)
from loraplex.bench.serve.attacker import (
    ATTACKER,
    KINDS,
    SAMPLING_VARIANTS,
    AttackPlan,
    AttackRecord,
    PathologicalAdapter,
    schedule,
)
from loraplex.bench.serve.config import ServeBenchConfig
from loraplex.bench.serve.driver import DriveConfig, RequestRecord, ResidencyView
from loraplex.bench.workloads import ScenarioParams
from loraplex.cli import app
from loraplex.demo.assets import DemoAssets

HOSTILE = ("regex", "huge-weights", "huge-header")
TINY = ScenarioParams(duration_s=2.0, rate=6.0, prompt_tokens=8, output_tokens=4, num_adapters=1)


def test_adversarial_is_an_accepted_scenario_and_unknown_names_are_refused() -> None:
    assert ServeBenchConfig(scenarios=("adversarial",)).scenarios == ("adversarial",)
    with pytest.raises(ValueError, match="scenarios"):
        ServeBenchConfig(scenarios=("adversarial", "nope"))
    result = CliRunner().invoke(app, ["bench", "serve", "--scenarios", "adversarial,nope"])
    assert result.exit_code == 2 and "nope" in result.output


CONFIG_FIELDS = ("attack_rate", "attack_max_in_flight", "rounds", "prompt_bytes",
                 "header_bytes", "regex_depth")  # fmt: skip


@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_config_refuses_non_positive_values(field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} 0 is invalid"):
        AdversarialConfig(**{field: 0})


def test_workload_holds_only_victims_and_names_the_attackers_adapter() -> None:
    workload = adversarial_workload(0, TINY)
    assert workload.requests and {r.tenant for r in workload.requests} <= set(VICTIMS)
    assert {a.tenant for a in workload.adapters} == {*VICTIMS, ATTACKER}


def test_schedule_cycles_every_kind_and_variant() -> None:
    hostile = tuple(PathologicalAdapter(n, Path(n)) for n in HOSTILE)
    plan = AttackPlan(8.0, 4.0, 2, 5000, "attack0", 10.0, 600, 0)
    requests = schedule(plan, hostile)
    assert len(requests) == 32
    assert Counter(r.kind for r in requests) == {kind: 8 for kind in KINDS}
    sampling = {r.detail for r in requests if r.kind == "sampling"}
    assert sampling == {detail for detail, _ in SAMPLING_VARIANTS}
    for request in requests:
        body = json.loads(request.body)  # NaN survives: Python's parser reads it
        if request.kind == "oversized-prompt":
            text = body.get("prompt") or body["messages"][0]["content"]
            assert len(text) == 5000
        elif request.kind == "cold-adapter":
            assert body["model"] == f"{request.adapter}@attack0"
        elif request.kind == "cancel":
            assert request.cancel_after_tokens is not None and body["stream"] is True
        if request.kind != "oversized-prompt" and request.detail != "prompt=[2**40]":
            assert all(4 <= token < 600 for token in body["prompt"])
    assert {r.adapter for r in requests if r.kind == "cold-adapter"} == {a.name for a in hostile}


def test_pathological_adapters_are_hostile_but_well_formed(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    import re

    from safetensors.torch import load_file

    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.artifacts.safetensors_header import read_safetensors_header
    from loraplex.bench.serve.attack_adapters import HUGE_WEIGHT, write_pathological_adapters

    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    written = write_pathological_adapters(
        base, demo_assets.base_model_dir, tmp_path, header_bytes=300_000, regex_depth=6
    )
    paths = {a.name: a.path for a in written}
    pattern = json.loads((paths["regex"] / "adapter_config.json").read_text())["target_modules"]
    assert re.fullmatch(pattern, base.module_path(0, "q_proj"))
    assert not re.fullmatch(pattern, base.module_path(0, "k_proj"))
    tensors = load_file(str(paths["huge-weights"] / "adapter_model.safetensors"))
    lora_b = [t for name, t in tensors.items() if ".lora_B." in name]
    assert lora_b and all(bool((t == HUGE_WEIGHT).all()) for t in lora_b)
    assert all(math.isfinite(float(t.max())) for t in lora_b)
    weights = paths["huge-header"] / "adapter_model.safetensors"
    header = read_safetensors_header(weights)
    assert header.data_start == 8 + 300_000 and len(header.metadata) > 10_000
    assert {e.name for e in header.entries} == set(load_file(str(weights)))


def _record(
    status: int, ttft_s: float | None, tokens: int, error: str | None = None
) -> RequestRecord:
    return RequestRecord(0.0, "steady-a", "ad0000", "L0", status, ttft_s, None, tokens, "r1", error)


def test_metrics_count_cut_streams_and_timeouts_as_failures() -> None:
    workload = adversarial_workload(0, TINY)
    n, want = len(workload.requests), TINY.output_tokens
    calm = tuple(_record(200, 0.010, want) for _ in range(n))
    attacked = (_record(0, None, 0, "timeout"), _record(200, 0.02, want - 1),
                *(_record(200, 0.020, want) for _ in range(n - 2)))  # fmt: skip
    attacks = (AttackRecord(0.1, "sampling", "top_p=1e-46", 400, "bad"),
               AttackRecord(0.2, "cancel", "after-1", 200, None),
               AttackRecord(0.3, "cold-adapter", "regex", 200, "engine_error"))  # fmt: skip
    runs = [
        AdversarialRun("adversarial/calm", False, calm, ResidencyView(), (), (0.001, 0.003)),
        AdversarialRun("adversarial/attacked", True, attacked, ResidencyView(), attacks, (0.002,)),
    ]
    metrics = adversarial_metrics(runs, workload, timeout_s=60.0)
    assert metrics["adversarial_victim_failed"] == 2 and metrics["adversarial_victim_requests"] == n
    assert metrics["adversarial_victim_failed_ratio"] == round(2 / n, 4)
    assert metrics["adversarial_victim_failed_calm"] == 0
    # Failures count in the percentile as the timeout.
    assert metrics["adversarial_victim_p99_ttft_ms_attacked"] == 60_000.0
    assert metrics["adversarial_victim_p99_ttft_ms_calm"] == 10.0
    assert metrics["adversarial_victim_p99_ttft_ratio"] == 6000.0
    assert metrics["keepalive_rtt_ms"] == 2.0
    assert metrics["adversarial_attacker_statuses"] == {"200": 1, "200-error": 1, "400": 1}
    assert metrics["adversarial_attacker_by_kind"]["sampling"] == {"400": 1}
    alone = adversarial_metrics(runs[1:], workload, 60.0)
    assert alone["adversarial_victim_p99_ttft_ratio"] is None  # no calm run: undefined


class _Models(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless the reply says otherwise
    connections: ClassVar[list[object]] = []
    close = False

    def setup(self) -> None:
        super().setup()
        self.connections.append(self.connection)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        if self.close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[tuple[str, type[_Models]]]:
    handler = type("Models", (_Models,), {"connections": []})
    with local_server(handler) as url:
        yield url, handler


def test_keepalive_rtts_reuse_one_connection(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    rtts = keepalive_rtts(url, "key", 5)
    assert len(rtts) == 5 and all(rtt > 0 for rtt in rtts)
    assert len(handler.connections) == 1
    handler.close = True
    with pytest.raises(RuntimeError, match="kept-alive"):
        keepalive_rtts(url, "key", 2)


def test_runs_alternate_calm_and_attacked_between_rounds() -> None:
    assert [(r.name, r.attacked, r.round_index) for r in run_order(1)] == [
        ("adversarial/calm", False, 0), ("adversarial/attacked", True, 0)
    ]  # fmt: skip
    assert [r.name for r in run_order(3)] == [
        "adversarial/calm-0", "adversarial/attacked-0", "adversarial/attacked-1",
        "adversarial/calm-1", "adversarial/calm-2", "adversarial/attacked-2",
    ]  # fmt: skip


@pytest.mark.slow  # two real server runs (about 20 s on 2 shared cores)
def test_tiny_run_attacks_and_measures_both_sides(demo_assets: DemoAssets, tmp_path: Path) -> None:
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.bench.serve.fleet import ServerOptions, prepare_fleet

    model_dir = demo_assets.base_model_dir
    workload = adversarial_workload(0, TINY)
    used = {(r.tenant, r.adapter) for r in workload.requests} | {(ATTACKER, "ok")}
    adapters = tuple(a for a in workload.adapters if (a.tenant, a.name) in used)
    fleet = prepare_fleet(tmp_path / "fleet", model_dir, adapters, 64, 0)
    vocab = BaseModelSpec.from_dir(model_dir).vocab_size
    drive = DriveConfig(request_timeout_s=30.0, vocab_size=vocab)
    config = AdversarialConfig(attack_rate=4.0, prompt_bytes=64 << 10, header_bytes=200_000,
                               regex_depth=6)  # fmt: skip
    options = ServerOptions("cost_aware", 8, 64 << 20, queue_deadline_s=15.0)
    runs = run_adversarial(fleet, tmp_path / "adv", workload, options=options, drive=drive,
                           config=config)  # fmt: skip
    assert [(r.name, r.attacked) for r in runs] == [
        ("adversarial/calm", False), ("adversarial/attacked", True)
    ]  # fmt: skip
    for run in runs:
        assert len(run.records) == len(workload.requests)
        assert [r.tenant for r in run.records] == [r.tenant for r in workload.requests]
        assert len(run.keepalive_rtt_s) == KEEPALIVE_REQUESTS
    calm, attacked = runs
    assert calm.attacks == ()
    kinds = Counter(a.kind for a in attacked.attacks)
    assert kinds == {"register": 3, **{kind: 2 for kind in KINDS}}
    assert {a.detail for a in attacked.attacks if a.kind == "register"} == set(HOSTILE)
    # An oversized prompt is refused with a client error, never served or left unanswered.
    assert {a.status for a in attacked.attacks if a.kind == "oversized-prompt"} <= {400, 413}
    metrics = adversarial_metrics(runs, workload, drive.request_timeout_s)
    assert metrics["adversarial_attacker_requests"] == 11
    assert sum(metrics["adversarial_attacker_statuses"].values()) == 11
    assert 0.0 <= metrics["adversarial_victim_failed_ratio"] <= 1.0
    assert metrics["adversarial_victim_requests"] == len(workload.requests)
    assert metrics["keepalive_rtt_ms"] > 0
