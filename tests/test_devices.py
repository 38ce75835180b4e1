"""Device names: refused before start naming ``device`` and what is accepted; a CUDA device
that is not there refused naming it too, with the devices torch sees."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.devices import check_device, torch_device
from loraplex.engine.config import EngineConfig
from loraplex.serve.config import ServeConfig


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:7"])
def test_device_names_we_run_on_pass_the_torch_free_check(name: str) -> None:
    assert check_device(name) == name


@pytest.mark.parametrize("name", ["tpu", "mps", "CUDA", "cuda:", "cuda:-1", "cuda:x", "", "cpu:0"])
def test_other_device_names_are_refused_naming_the_key(tmp_path: Path, name: str) -> None:
    expected = f"device {name!r} is invalid; expected cpu, cuda or cuda:N"
    with pytest.raises(ValueError, match=f"^{expected}"):
        ServeConfig(data_dir=tmp_path, device=name)
    with pytest.raises(ValueError, match=f"^{expected}"):
        EngineConfig(device=name)


def test_a_cuda_device_torch_does_not_see_is_refused_naming_the_key() -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=rf"^device 'cuda:{count}' is invalid here; expected cpu"):
        torch_device(f"cuda:{count}")
    assert torch_device("cpu") == torch.device("cpu")
    if count == 0:
        with pytest.raises(ValueError, match=r"torch sees 0 CUDA devices"):
            torch_device("cuda")
