"""Sampling filters and parameter validation."""

from __future__ import annotations

import pytest
import torch

from loraplex.model.sampler import filter_logits, make_generator, sample_rows
from loraplex.sampling import SamplingParams

LOGITS = torch.log(torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15]))


def kept(logits: torch.Tensor) -> set[int]:
    return {i for i, v in enumerate(logits.tolist()) if v != float("-inf")}


def test_top_k_keeps_the_k_most_likely() -> None:
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))) == {1, 3}
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_k=50))) == set(range(5))


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [(0.3, {1}), (0.4, {1}), (0.5, {1, 3}), (0.7, {1, 3}), (0.8, {1, 3, 4}), (1.0, set(range(5)))],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p: float, expected: set[int]) -> None:
    assert kept(filter_logits(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))) == expected


def test_temperature_scales_before_filtering() -> None:
    out = filter_logits(LOGITS, SamplingParams(temperature=0.5))
    assert torch.allclose(out, LOGITS / 0.5)


def test_seeded_draws_repeat_and_greedy_draws_nothing() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(temperature=1.0, seed=4),
        SamplingParams(),
        SamplingParams(temperature=1.0, seed=4),
    ]
    draws = [
        sample_rows(logits, params, [make_generator(p, torch.device("cpu")) for p in params])
        for _ in range(2)
    ]
    assert not draws[0].failures and draws[0].tokens == draws[1].tokens
    assert draws[0].tokens[1] == int(logits[1].argmax())
    assert make_generator(SamplingParams(), torch.device("cpu")) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", 0),
        ("stop", ("",)),
    ],
)
def test_invalid_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]
