"""adapter_config.json parsing: PEFT matching semantics, scale math, and every rejection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.artifacts.manifest import (
    MAX_CONFIG_BYTES,
    LoraSpec,
    parse_adapter_config,
    read_adapter_config,
)
from loraplex.errors import AdapterConfigError, UnsupportedAdapterError

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def spec(**fields: object) -> LoraSpec:
    config: dict[str, object] = {"peft_type": "LORA", "r": 4, "lora_alpha": 8}
    config["target_modules"] = ["q_proj", "v_proj"]
    config.update(fields)
    return parse_adapter_config(config)


def targeted(lora: LoraSpec, num_layers: int = 3) -> set[tuple[int, str]]:
    return {(i, m) for i in range(num_layers) for m in MODULES if lora.targets(i, m)}


def test_minimal_config_uses_peft_defaults() -> None:
    lora = parse_adapter_config({"peft_type": "LORA", "target_modules": ["q_proj"]})
    assert (lora.r, lora.lora_alpha, lora.use_rslora) == (8, 8.0, False)
    assert lora.base_model_name_or_path is None
    assert lora.scale_for(0, "q_proj") == 1.0


def test_list_targets_match_by_path_suffix() -> None:
    assert targeted(spec(target_modules=["q_proj", "down_proj"])) == {
        (i, m) for i in range(3) for m in ("q_proj", "down_proj")
    }
    # a dotted entry matches on whole segments: "self_attn.q_proj" yes, "attn.q_proj" no
    assert targeted(spec(target_modules=["self_attn.q_proj"])) == {(i, "q_proj") for i in range(3)}
    assert targeted(spec(target_modules=["attn.q_proj"])) == set()
    assert targeted(spec(target_modules=["model.layers.1.mlp.up_proj"])) == {(1, "up_proj")}


def test_all_linear_targets_every_projection() -> None:
    assert targeted(spec(target_modules="all-linear"), 2) == {
        (i, m) for i in range(2) for m in MODULES
    }


def test_regex_targets_full_match() -> None:
    lora = spec(target_modules=r".*\.layers\.[02]\.self_attn\.(q|k)_proj")
    assert targeted(lora) == {(0, "q_proj"), (0, "k_proj"), (2, "q_proj"), (2, "k_proj")}
    # a partial match is not enough
    assert targeted(spec(target_modules="q_proj")) == set()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        # PEFT's LoraConfig refuses both beside a regex (loraplex used to ignore them)
        ({"target_modules": r".*\.q_proj", "layers_to_transform": [1]}, "layers_to_transform"),
        ({"target_modules": r".*\.q_proj", "layers_to_transform": []}, "layers_to_transform"),
        ({"target_modules": "all-linear", "layers_to_transform": 0}, "layers_to_transform"),
        ({"target_modules": r".*\.q_proj", "layers_pattern": "layers"}, "layers_pattern"),
        # layers_pattern only says where layers_to_transform's indices are
        ({"layers_pattern": "layers"}, "layers_pattern"),
        ({"layers_pattern": ["layers"], "layers_to_transform": []}, "layers_pattern"),
    ],
)
def test_layer_fields_that_would_do_nothing_are_refused(
    fields: dict[str, object], field: str
) -> None:
    with pytest.raises(AdapterConfigError) as info:
        spec(**fields)
    assert info.value.field == field
    assert repr(field) in str(info.value)


def test_layers_to_transform_and_layers_pattern() -> None:
    assert targeted(spec(layers_to_transform=[0, 2])) == {
        (i, m) for i in (0, 2) for m in ("q_proj", "v_proj")
    }
    assert targeted(spec(layers_to_transform=1)) == {(1, "q_proj"), (1, "v_proj")}
    assert targeted(spec(layers_to_transform=[1], layers_pattern="layers")) == {
        (1, "q_proj"),
        (1, "v_proj"),
    }
    # PEFT: a layers_pattern that names no container in the path selects nothing
    assert targeted(spec(layers_to_transform=[1], layers_pattern=["h"])) == set()
    assert targeted(spec(layers_to_transform=[])) == targeted(spec())


def test_exclude_modules() -> None:
    lora = spec(target_modules=["q_proj", "v_proj"], exclude_modules=["layers.1.self_attn.v_proj"])
    assert (1, "v_proj") not in targeted(lora)
    assert (0, "v_proj") in targeted(lora)
    assert targeted(spec(exclude_modules=r".*\.q_proj")) == {(i, "v_proj") for i in range(3)}


def test_rank_and_alpha_patterns_first_match_in_config_order() -> None:
    lora = spec(
        r=8,
        lora_alpha=16,
        target_modules=MODULES,
        rank_pattern={"layers.1.self_attn.q_proj": 2, "q_proj": 4, "mlp\\..*_proj": 6},
        alpha_pattern={"down_proj": 3, "proj": 100},
    )
    assert lora.rank_for(1, "q_proj") == 2
    assert lora.rank_for(0, "q_proj") == 4
    assert lora.rank_for(0, "gate_proj") == 6
    assert lora.rank_for(0, "k_proj") == 8
    # "proj" must match whole trailing segments, so it never matches "q_proj"
    assert lora.alpha_for(0, "k_proj") == 16
    assert lora.alpha_for(1, "down_proj") == 3
    assert lora.scale_for(1, "q_proj") == 16 / 2
    assert lora.scale_for(0, "down_proj") == 3 / 6
    assert lora.max_rank == 8
    assert lora.rank_source(1, "q_proj") == "rank_pattern['layers.1.self_attn.q_proj']"
    assert lora.rank_source(0, "k_proj") == "r"


def test_rslora_scale_uses_square_root_of_rank() -> None:
    lora = spec(r=16, lora_alpha=8, use_rslora=True, rank_pattern={"v_proj": 4})
    assert lora.scale_for(0, "q_proj") == pytest.approx(8 / math.sqrt(16))
    assert lora.scale_for(0, "v_proj") == pytest.approx(8 / math.sqrt(4))
    assert spec(r=16, lora_alpha=8).scale_for(0, "q_proj") == 0.5


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("r", 0, "int > 0"),
        ("r", -2, "int > 0"),
        ("r", 4.0, "int > 0"),
        ("r", "8", "int > 0"),
        ("r", True, "int > 0"),
        ("lora_alpha", "16", "number > 0"),
        ("lora_alpha", 0, "number > 0"),
        ("lora_alpha", -1.5, "number > 0"),
        ("lora_alpha", float("nan"), "number > 0"),
        ("lora_alpha", float("inf"), "number > 0"),
        # past float32's largest value: the engine's scale (alpha / r) overflowed in the op
        ("lora_alpha", 1e39, "float32's largest"),
        # float() of it raised OverflowError
        pytest.param("lora_alpha", 10**400, "float32's largest", id="lora_alpha-10**400"),
        # its scale, alpha / r, raised OverflowError
        pytest.param("r", 10**400, "<= 2147483647", id="r-10**400"),
        # ignored by inference (training only), but not when it is no number at all
        ("lora_dropout", float("nan"), "finite number"),
        ("lora_dropout", float("inf"), "finite number"),
        ("lora_dropout", float("-inf"), "finite number"),
        ("use_rslora", "yes", "true or false"),
        ("base_model_name_or_path", 3, "string or null"),
        ("target_modules", None, "list of non-empty strings"),
        ("target_modules", [], "at least one module"),
        ("target_modules", ["q_proj", 3], "list of non-empty strings"),
        ("target_modules", "(", "valid regular expression"),
        ("rank_pattern", ["q_proj"], "object mapping"),
        ("layers_pattern", "(?P<idx>x)", "valid regular expression"),
        ("exclude_modules", 7, "list of non-empty strings"),
        ("layers_to_transform", [-1], "int >= 0"),
        ("layers_to_transform", "0", "int >= 0"),
    ],
)
def test_bad_values_raise_config_error_naming_field(
    field: str, value: object, expected: str
) -> None:
    with pytest.raises(AdapterConfigError) as info:
        spec(**{field: value})
    assert not isinstance(info.value, UnsupportedAdapterError)
    assert info.value.field == field
    assert info.value.value == value or value != value  # NaN never equals itself
    assert expected in info.value.expected
    assert repr(field) in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ({"q_proj": 0}, "rank_pattern['q_proj']"),
        ({"q_proj": 2.5}, "rank_pattern['q_proj']"),
    ],
)
def test_bad_rank_pattern_value_names_key(key: dict[str, object], value: str) -> None:
    with pytest.raises(AdapterConfigError) as info:
        spec(rank_pattern=key)
    assert info.value.field == value


@pytest.mark.parametrize(
    ("field", "key"), [("rank_pattern", "(?i)q_proj"), ("alpha_pattern", "q_proj(")]
)
def test_pattern_keys_must_compile_as_peft_embeds_them(field: str, key: str) -> None:
    # "(?i)" alone compiles, but not once PEFT wraps it as "(.*\.)?((?i)q_proj)$"
    with pytest.raises(AdapterConfigError) as info:
        spec(**{field: {key: 2}})
    assert (info.value.field, info.value.value) == (field, key)
    assert "valid regular expression" in info.value.expected


def test_bad_alpha_pattern_value_names_key() -> None:
    with pytest.raises(AdapterConfigError) as info:
        spec(alpha_pattern={"v_proj": "x"})
    assert info.value.field == "alpha_pattern['v_proj']"
    assert info.value.value == "x"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("alpha_pattern", 1e39, "float32's largest"),
        pytest.param("alpha_pattern", 10**400, "float32's largest", id="alpha_pattern-10**400"),
        pytest.param("rank_pattern", 10**400, "<= 2147483647", id="rank_pattern-10**400"),
    ],
)
def test_a_pattern_value_past_its_bound_names_its_key(
    field: str, value: object, expected: str
) -> None:
    with pytest.raises(AdapterConfigError) as info:
        spec(**{field: {"v_proj": value}})
    assert info.value.field == f"{field}['v_proj']"
    assert expected in info.value.expected


def test_the_largest_alpha_accepted_gives_a_finite_float32_scale() -> None:
    largest = spec(r=1, lora_alpha=3.4028234663852886e38, alpha_pattern={"v_proj": 1e38})
    assert largest.scale_for(0, "q_proj") == 3.4028234663852886e38  # alpha / 1
    assert largest.scale_for(0, "v_proj") == 1e38


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("use_dora", True, "DoRA"),
        ("bias", "all", '"none"'),
        ("bias", "lora_only", '"none"'),
        ("fan_in_fan_out", True, "false"),
        ("lora_bias", True, "LoRA bias"),
        ("use_qalora", True, "QA-LoRA"),
        ("modules_to_save", ["lm_head"], "null or empty"),
        ("trainable_token_indices", [1, 2], "null or empty"),
        ("layer_replication", [[0, 2]], "null or empty"),
        ("target_parameters", ["mlp.experts.gate_up_proj"], "null or empty"),
        ("init_lora_weights", "pissa", "modifies the base weights"),
        ("init_lora_weights", "olora", "modifies the base weights"),
        ("some_future_feature", {"on": True}, "unknown PEFT feature"),
        ("task_type", "SEQ_CLS", "CAUSAL_LM"),
        ("peft_type", "LOHA", "LORA"),
    ],
)
def test_unsupported_features_name_the_field(field: str, value: object, expected: str) -> None:
    with pytest.raises(UnsupportedAdapterError) as info:
        spec(**{field: value})
    assert info.value.field == field
    assert info.value.value == value
    assert expected in info.value.expected


@pytest.mark.parametrize(
    "targets", [["q_proj", "lm_head"], ["embed_tokens"], ["model.norm"], r".*(q_proj|lm_head)"]
)
def test_non_projection_targets_are_unsupported(targets: object) -> None:
    with pytest.raises(UnsupportedAdapterError) as info:
        spec(target_modules=targets)
    assert info.value.field == "target_modules"
    assert "q_proj" in info.value.expected


def test_neutral_values_of_unsupported_features_are_accepted() -> None:
    lora = spec(
        modules_to_save=[],
        use_dora=False,
        lora_bias=False,
        init_lora_weights="gaussian",
        megatron_core="megatron.core",
        some_future_feature=None,
        loftq_config={},
        lora_dropout=0.1,
    )
    assert lora.r == 4


def test_missing_peft_type_is_a_config_error() -> None:
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config({"r": 4, "target_modules": ["q_proj"]})
    assert info.value.field == "peft_type"


def test_read_adapter_config_errors(tmp_path: Path) -> None:
    with pytest.raises(AdapterConfigError, match=r"adapter_config\.json") as info:
        read_adapter_config(tmp_path)
    assert info.value.field == "path"
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterConfigError) as info:
        read_adapter_config(tmp_path)
    assert info.value.field == "json"
    (tmp_path / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(AdapterConfigError, match="JSON object"):
        read_adapter_config(tmp_path)
    # an integer of more digits than Python converts: json.loads raises a plain ValueError
    (tmp_path / "adapter_config.json").write_text('{"lora_alpha": 1' + "0" * 5000 + "}")
    with pytest.raises(AdapterConfigError) as info:
        read_adapter_config(tmp_path)
    assert info.value.field == "json"
    (tmp_path / "adapter_config.json").write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(AdapterConfigError) as info:
        read_adapter_config(tmp_path)
    assert info.value.field == "size_bytes"


def test_read_adapter_config_round_trip(tmp_path: Path) -> None:
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["k_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    assert read_adapter_config(tmp_path) == parse_adapter_config(config)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
# Config fields the parser reads, rejects or ignores, and one it has never heard of.
_FIELDS = st.sampled_from(
    [
        "r",
        "lora_alpha",
        "use_rslora",
        "target_modules",
        "rank_pattern",
        "alpha_pattern",
        "layers_to_transform",
        "layers_pattern",
        "exclude_modules",
        "bias",
        "use_dora",
        "modules_to_save",
        "fan_in_fan_out",
        "task_type",
        "peft_type",
        "init_lora_weights",
        "base_model_name_or_path",
        "brand_new_field",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_FIELDS, _JSON, max_size=4))
def test_arbitrary_field_values_only_raise_typed_errors(fields: dict[str, object]) -> None:
    config: dict[str, object] = {"peft_type": "LORA", "target_modules": ["q_proj"], **fields}
    try:
        lora = parse_adapter_config(config)
    except AdapterConfigError:
        return
    for layer in range(2):
        for module in MODULES:
            if lora.targets(layer, module):
                assert lora.rank_for(layer, module) > 0
                assert math.isfinite(lora.scale_for(layer, module))
