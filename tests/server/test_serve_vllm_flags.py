"""A vLLM user's ``vllm serve`` command line on ``loraplex serve``: the flags both take are
taken; every other vLLM flag is refused (exit 2, nothing starts) naming it and what to use
instead, all of them in one answer. It was click's ``No such option: --enable-lora`` alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli.vllm_flags import vllm_hints
from loraplex.serve.config import ServeConfig
from loraplex.serve.config.vllm import VLLM_ONLY_FLAGS

VLLM_LINE = [
    "/models/Llama-3-8B",
    "--enable-lora",
    "--lora-modules",
    "sql-lora=/loras/sql",
    "--max-loras",
    "4",
    "--max-lora-rank",
    "16",
    "--max-cpu-loras",
    "8",
]


class Started(Exception):
    """Raised in place of starting the server: the settings were taken."""


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    taken: list[ServeConfig] = []

    def started(settings: ServeConfig) -> None:
        taken.append(settings)
        raise Started

    monkeypatch.setattr("loraplex.cli.serve._run", started)
    return taken


def test_a_vllm_command_line_names_each_vllm_flag_and_what_to_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    taken = _capture(monkeypatch)
    args = ["serve", *VLLM_LINE, "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert not taken  # nothing started
    assert "--enable-lora: loraplex always serves LoRA adapters" in result.output, result.output
    assert "--lora-modules: adapters are registered" in result.output
    assert "loraplex adapters register PATH --tenant T --name NAME" in result.output
    assert "loraplex serve takes it as --model DIR" in result.output  # the positional MODEL


def test_the_flags_vllm_shares_are_taken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    taken = _capture(monkeypatch)
    args = ["serve", *VLLM_LINE[4:], "--data-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, Started), result.output
    assert (taken[0].max_loras, taken[0].max_lora_rank, taken[0].max_cpu_loras) == (4, 16, 8)


def _serve_flags() -> set[str]:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


@pytest.mark.parametrize("flag", sorted(VLLM_ONLY_FLAGS))
def test_each_vllm_only_flag_is_refused_with_its_replacement(tmp_path: Path, flag: str) -> None:
    assert flag not in _serve_flags()  # the table never shadows one of serve's own flags
    result = CliRunner().invoke(app, ["serve", f"{flag}=1", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"{flag}: {VLLM_ONLY_FLAGS[flag]}" in " ".join(result.output.split())


def test_another_unknown_flag_keeps_clicks_error_alone(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--zz-unknown", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "No such option: --zz-unknown" in result.output
    assert "vLLM" not in result.output


def test_hints_name_each_flag_once_in_order() -> None:
    hints = vllm_hints(["--api-key", "k", "--enable-lora", "--api-key=k2"])
    assert [hint.split(":")[0] for hint in hints] == ["--api-key", "--enable-lora"]


def test_a_vllm_flag_as_a_config_key_is_named_as_vllms(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[serve]\nenable_lora = true\nmax_loras = 4\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["serve", "--config", str(path)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "enable_lora: vLLM's --enable-lora, which loraplex serve does not take" in text, text
    assert "did you mean max_loras" not in text  # click-like near name: it misled


CPU_LORAS_REFUSED = "max_cpu_loras 2 is invalid with max_loras 4; expected >= max_loras (4)"


@pytest.mark.parametrize("where", ["flags", "file"])
def test_fewer_cpu_loras_than_gpu_slots_is_refused_as_vllm_refuses_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    """vLLM: ``max_cpu_loras must be >= max_loras``; it was taken (and started)."""
    taken = _capture(monkeypatch)
    args = ["serve", "--data-dir", str(tmp_path), "--max-loras", "4", "--max-cpu-loras", "2"]
    if where == "file":
        path = tmp_path / "serve.toml"
        path.write_text("[serve]\nmax_loras = 4\nmax_cpu_loras = 2\n", encoding="utf-8")
        args = ["serve", "--data-dir", str(tmp_path), "--config", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert not taken  # nothing started
    assert CPU_LORAS_REFUSED in " ".join(result.output.replace("│", " ").split()), result.output
