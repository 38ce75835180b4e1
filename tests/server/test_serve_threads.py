"""``loraplex serve``'s torch thread default leaves a core to the event loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.cli.serve import default_torch_threads
from loraplex.serve.config import ServeConfig, merge


@pytest.mark.parametrize(("cores", "expected"), [(2, 1), (16, 15), (1, 1), (None, 1)])
def test_default_is_all_cores_but_one(cores: int | None, expected: int) -> None:
    assert default_torch_threads(None, cores) == expected


def test_omp_num_threads_is_left_to_torch() -> None:
    assert default_torch_threads("3", 16) is None


def test_threads_flag_reaches_the_config(tmp_path: Path) -> None:
    assert merge({}, {"data_dir": tmp_path, "torch_threads": 2}).torch_threads == 2
    assert merge({}, {"data_dir": tmp_path}).torch_threads is None
    with pytest.raises(ValueError, match=r"^threads 0 is invalid"):  # the key, as set
        ServeConfig(data_dir=tmp_path, torch_threads=0)
