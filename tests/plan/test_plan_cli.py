"""``loraplex plan`` refuses a bad input naming the flag it came in (newop): a zero, negative or
repeated swept value was refused as ``Candidate.cpu_adapter_bytes 0`` or ``SweepSpace.replicas``
(names no flag has), a missing trace file as a bare ``[Errno 2]``, a negative price as
``MachinePrice.usd_per_hour``, each after ``Invalid value:`` with no flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app

runner = CliRunner()
LINE = {"t_s": 0.0, "tenant": "t", "adapter": "a", "prompt_tokens": 8, "output_tokens": 4}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(LINE) + "\n" + json.dumps({**LINE, "t_s": 0.5}) + "\n")
    return path


def _plan(trace: Path, *extra: str) -> tuple[int, str]:
    args = ["plan", "--trace", str(trace), "--slo", "ttft_p99<=500ms"]
    args += ["--hardware", "h100-sxm-llama2-7b-bf16", "--replicas", "1", "--max-loras", "4"]
    args += ["--cpu-bytes", "64MiB", "--eviction", "lru", "--json", *extra]
    result = runner.invoke(app, args)
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--replicas", "1,1"], "--replicas"),
        (["--max-loras", "-1"], "--max-loras"),
        (["--cpu-bytes", "0B"], "--cpu-bytes"),
        (["--disk-bytes", "1GiB,1GiB"], "--disk-bytes"),
        (["--merged-replicas", "-1"], "--merged-replicas"),
        (["--usd-per-hour", "-3", "--price-source", "x"], "--usd-per-hour"),
        (["--hardware", "no-such-gpu"], "--hardware"),
        (["--cost-tolerance", "-1"], "--cost-tolerance"),
        (["--slo", "ttft_p99<=-5ms"], "--slo"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag(trace: Path, extra: list[str], flag: str) -> None:
    code, out = _plan(trace, *extra)
    assert code == 2 and f"Invalid value for {flag}" in out, out
    assert "Candidate." not in out and "SweepSpace." not in out and "MachinePrice." not in out


def test_a_missing_or_bad_trace_is_refused_naming_trace(trace: Path, tmp_path: Path) -> None:
    code, out = _plan(tmp_path / "absent.jsonl")
    assert code == 2 and "Invalid value for --trace" in out and "absent.jsonl" in out, out
    trace.write_text(json.dumps({**LINE, "output_tokens": -4}) + "\n")
    code, out = _plan(trace)
    assert code == 2 and "Invalid value for --trace" in out and "output_tokens -4" in out, out
    # NOTE: an arrival of 1e300 s was planned (its requests timed out on a clock that no longer
    # moved); past MAX_T_S it is refused naming the line and the field
    trace.write_text(json.dumps(LINE) + "\n" + json.dumps({**LINE, "t_s": 1e300}) + "\n")
    code, out = _plan(trace)
    assert code == 2 and "Invalid value for --trace" in out and f"{trace}:2: t_s 1e+300" in out


def test_an_empty_trace_is_refused_naming_it(trace: Path) -> None:
    """newop: an empty trace planned 0 requests and said no configuration met the objectives."""
    trace.write_text("\n\n")
    code, out = _plan(trace)
    assert code == 2 and "Invalid value for --trace" in out and "holds no request" in out, out


def test_good_values_still_plan(trace: Path) -> None:
    code, out = _plan(trace, "--replicas", "1,2", "--merged-replicas", "0")
    assert code == 0, out
    record = json.loads(out)
    assert record["candidates"] == 3 and record["best"] is not None


def test_a_rank_above_max_lora_rank_is_refused_naming_the_trace_or_taken_with_the_flag(
    trace: Path,
) -> None:
    """A trace line's ``rank`` above the simulator's ``max_lora_rank`` (64) ended ``plan`` in a
    ValueError traceback from the first candidate's simulation, and no flag set the rank a
    server of ``max_lora_rank = 128`` serves (newop4)."""
    trace.write_text(json.dumps({**LINE, "rank": 128}) + "\n")
    code, out = _plan(trace)
    assert code == 2 and "Invalid value for --trace" in out and "--max-lora-rank 64" in out, out
    code, out = _plan(trace, "--max-lora-rank", "128")
    assert code == 0, out
    code, out = _plan(trace, "--max-lora-rank", "0")
    assert code == 2 and "Invalid value for --max-lora-rank" in out, out
