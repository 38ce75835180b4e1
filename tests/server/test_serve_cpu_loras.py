"""``max_cpu_loras`` below ``max_loras`` is refused naming both, as vLLM refuses it
(``max_cpu_loras must be >= max_loras``), wherever the two are set: ``ServeConfig`` (``serve``'s
flags and ``--config`` file: test_serve_vllm_flags.py; ``fleet up``: test_fleet_up_cli.py) and a
``k8s render --serve-config`` file beside ``--max-loras``. It was taken (a migrating user's
``--max-cpu-loras 2 --max-loras 4`` started)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.serve.config import ServeConfig

REFUSED = "max_cpu_loras 2 is invalid with max_loras 4; expected >= max_loras (4)"


def test_fewer_cpu_loras_than_gpu_slots_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        ServeConfig(data_dir=tmp_path, max_loras=4, max_cpu_loras=2)
    assert str(refused.value).startswith(REFUSED)


@pytest.mark.parametrize(("max_loras", "max_cpu_loras"), [(4, 4), (4, 8), (4, None)])
def test_as_many_or_more_cpu_loras_are_taken(
    tmp_path: Path, max_loras: int, max_cpu_loras: int | None
) -> None:
    config = ServeConfig(data_dir=tmp_path, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    assert (config.max_loras, config.max_cpu_loras) == (max_loras, max_cpu_loras)


def test_k8s_render_refuses_a_serve_config_below_its_max_loras(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[serve]\nmax_cpu_loras = 2\n", encoding="utf-8")
    args = ["k8s", "render", "--image", "i:1", "--store", "s3://b/p", "--max-loras", "4"]
    result = CliRunner().invoke(app, [*args, "--serve-config", str(path)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # the error box's wrap
    assert "--serve-config" in said and REFUSED in said, result.output
