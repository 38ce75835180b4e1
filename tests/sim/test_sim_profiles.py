import pytest

from loraplex.sim.cost_model import LINKS
from loraplex.sim.profiles import (
    cited_fields,
    load_profile,
    price_of,
    profile_names,
    profile_path,
    uncited,
)


def test_there_are_gpu_profiles() -> None:
    assert {"h100-sxm-llama2-7b-bf16", "h200-sxm-llama2-7b-bf16"} <= set(profile_names())


@pytest.mark.parametrize("name", profile_names())
def test_every_profile_loads_is_unvalidated_and_cites_every_number(name: str) -> None:
    model = load_profile(name)
    assert model.hardware == name
    assert model.validated is False
    assert uncited(model) == []
    assert set(model.links) == set(LINKS)
    # Every citation names a public source or says how the number was derived.
    for key in cited_fields():
        source = model.sources[key]
        assert "http" in source or source.startswith("0:") or "roofline" in source, (key, source)


@pytest.mark.parametrize("name", profile_names())
def test_every_profile_has_a_cited_price(name: str) -> None:
    price = price_of(name)
    assert price is not None
    usd, source = price
    assert usd > 0 and "http" in source


def test_h200_is_faster_than_h100_only_where_its_memory_is() -> None:
    h100, h200 = load_profile("h100-sxm-llama2-7b-bf16"), load_profile("h200-sxm-llama2-7b-bf16")
    assert h200.step.step_fixed_s < h100.step.step_fixed_s
    assert h200.step.per_token_s == h100.step.per_token_s  # same GH100 compute


def test_unknown_hardware_is_refused_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="tpu-v9"):
        profile_path("tpu-v9")
    assert price_of("tpu-v9") is None
    own = tmp_path / "mine.json"
    own.write_text("{}")
    assert profile_path(str(own)) == own


def test_uncited_lists_missing_sources() -> None:
    model = load_profile("h100-sxm-llama2-7b-bf16")
    from dataclasses import replace

    bare = replace(model, sources={"model": "x"})
    assert "step.per_token_s" in uncited(bare)
    assert "links.L3_to_L2.fixed_s" in uncited(bare)


def test_a_weight_term_a_profile_sets_must_be_cited() -> None:
    from dataclasses import replace

    model = load_profile("h100-sxm-llama2-7b-bf16")
    assert "step.per_byte_token_s" not in uncited(model)  # not set: nothing to cite
    priced = replace(model, step=replace(model.step, per_byte_token_s=1e-15))
    assert uncited(priced) == ["step.per_byte_token_s"]
