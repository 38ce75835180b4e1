"""The one dtype table: names, bytes per element, safetensors codes and torch dtypes agree."""

from __future__ import annotations

import pytest

from loraplex.dtypes import (
    DTYPE_BYTES,
    DTYPE_NAMES,
    SAFETENSORS_CODES,
    bytes_per_element,
    check_dtype,
    torch_dtype,
)


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_bytes_and_torch_dtype_agree(name: str) -> None:
    assert torch_dtype(name).itemsize == bytes_per_element(name) == DTYPE_BYTES[name]
    assert str(torch_dtype(name)) == f"torch.{name}"


def test_safetensors_codes_name_exactly_the_served_dtypes() -> None:
    assert sorted(SAFETENSORS_CODES.values()) == sorted(DTYPE_NAMES)


def test_unknown_names_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="precision 'float64' is invalid; expected one of"):
        check_dtype("float64", "precision")
    with pytest.raises(ValueError, match="dtype 'int8' is invalid"):
        torch_dtype("int8")
    with pytest.raises(ValueError, match="dtype 'F32' is invalid"):
        bytes_per_element("F32")
