"""validate_adapter_dir: every rejection names what is wrong; a good adapter is fully described."""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.errors import (
    AdapterConfigError,
    BaseModelMismatchError,
    CorruptArtifactError,
    RankTooLargeError,
    TensorValidationError,
    UnsafeFormatError,
)

Q0_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q0_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def test_valid_adapter_is_fully_described(builder, base: BaseModelSpec) -> None:
    path = builder.write()
    adapter = validate_adapter_dir(path, base, max_lora_rank=16)
    weights = path / "adapter_model.safetensors"
    assert adapter.digest == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert adapter.dtype == "float32"
    assert adapter.max_rank == 4
    # q (16->16), v (16->8), down (24->16) in 2 layers, rank 4, 4 bytes per param
    assert adapter.estimated_bytes == 2 * ((16 + 16) + (16 + 8) + (24 + 16)) * 4 * 4
    assert adapter.tensor_bytes == adapter.estimated_bytes
    assert [(t.layer, t.module, t.kind) for t in adapter.tensors[:4]] == [
        (0, "q_proj", "A"),
        (0, "q_proj", "B"),
        (0, "v_proj", "A"),
        (0, "v_proj", "B"),
    ]
    q_b = adapter.tensors[1]
    assert (q_b.name, q_b.shape, q_b.dtype) == (Q0_B, (16, 4), "float32")
    raw = weights.read_bytes()[q_b.file_offset : q_b.file_offset + q_b.num_bytes]
    assert np.frombuffer(raw, "<f4").shape == (64,)
    assert [(m.layer, m.module, m.rank, m.scale) for m in adapter.modules][:3] == [
        (0, "q_proj", 4, 2.0),
        (0, "v_proj", 4, 2.0),
        (0, "down_proj", 4, 2.0),
    ]
    key = adapter.key("acme", "support-bot", "r1")
    assert key == AdapterKey(base.digest, "acme", "support-bot", "r1", adapter.digest)


@pytest.mark.parametrize(
    ("dtype", "name", "size"), [("F16", "float16", 2), ("BF16", "bfloat16", 2)]
)
def test_half_precision_dtypes(builder, base, kit, dtype: str, name: str, size: int) -> None:
    config = kit.config()
    adapter = validate_adapter_dir(builder.write(config, builder.tensors(config, dtype)), base, 8)
    assert adapter.dtype == name
    assert adapter.estimated_bytes == adapter.tensor_bytes == 2 * (32 + 24 + 40) * 4 * size


def test_rank_pattern_shapes_and_estimate(builder, base, kit) -> None:
    config = kit.config(rank_pattern={"layers.1.self_attn.q_proj": 8, "v_proj": 2})
    adapter = validate_adapter_dir(builder.write(config), base, 8)
    assert adapter.max_rank == 8
    ranks = {(m.layer, m.module): m.rank for m in adapter.modules}
    assert ranks == {
        (0, "q_proj"): 4,
        (1, "q_proj"): 8,
        (0, "v_proj"): 2,
        (1, "v_proj"): 2,
        (0, "down_proj"): 4,
        (1, "down_proj"): 4,
    }
    assert adapter.estimated_bytes == 4 * (32 * 12 + 24 * 4 + 40 * 8)


def test_wrong_base_model(builder, base, kit) -> None:
    path = builder.write(kit.config(base_model_name_or_path="org/other-model"))
    with pytest.raises(BaseModelMismatchError) as info:
        validate_adapter_dir(path, base, 16)
    assert "'org/other-model'" in str(info.value) and "'tiny-llama'" in str(info.value)
    # how to match them: the config's name or the served directory's (it named the two only)
    assert "set base_model_name_or_path to 'tiny-llama' (or leave it out)" in str(info.value)
    assert "or serve them from a directory named 'other-model'" in str(info.value)
    for recorded in ("tiny-llama", "/abs/tiny-llama/", "hub-org/tiny-llama", None):
        validate_adapter_dir(builder.write(kit.config(base_model_name_or_path=recorded)), base, 16)


def test_layers_beyond_base_model(builder, base, kit) -> None:
    config = kit.config(layers_to_transform=[1, 5])
    with pytest.raises(BaseModelMismatchError, match=r"names layers \[5\]; expected indices < 2"):
        validate_adapter_dir(builder.write(config, tensors={}), base, 16)


def test_no_targeted_module(builder, base, kit) -> None:
    config = kit.config(target_modules=[r"model.layers.9.self_attn.q_proj"])
    with pytest.raises(AdapterConfigError) as info:
        validate_adapter_dir(builder.write(config, tensors={}), base, 16)
    assert info.value.field == "target_modules"


def test_a_regex_target_matching_no_module_is_refused(builder, base, kit) -> None:
    config = kit.config(target_modules=r"model\.layers\.9\..*_proj")
    with pytest.raises(AdapterConfigError) as info:
        validate_adapter_dir(builder.write(config, tensors={}), base, 16)
    assert info.value.field == "target_modules"
    assert "to match at least one" in info.value.expected


# Each entry selects nothing on the 2-layer base (targets q_proj, v_proj, down_proj) while the
# rest of the config selects modules: PEFT skips it (0.21 warns for pattern keys); loraplex
# used to, too.
@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"rank_pattern": {"k_proj": 2}}, "rank_pattern", "k_proj"),  # not targeted
        ({"rank_pattern": {"(a+)+b": 2}}, "rank_pattern", "(a+)+b"),  # attack23's folder
        (
            {"rank_pattern": {"layers.7.self_attn.q_proj": 2}},
            "rank_pattern",
            "layers.7.self_attn.q_proj",
        ),
        ({"alpha_pattern": {"o_proj": 2}}, "alpha_pattern", "o_proj"),
        # every module "layers.0.self_attn.q_proj" matches is decided by "q_proj" first
        (
            {"rank_pattern": {"q_proj": 2, "layers.0.self_attn.q_proj": 4}},
            "rank_pattern",
            "layers.0.self_attn.q_proj",
        ),
        ({"alpha_pattern": {".*_proj": 2, "v_proj": 4}}, "alpha_pattern", "v_proj"),
        (
            {"target_modules": ["q_proj", "model.layers.5.mlp.down_proj"]},
            "target_modules",
            "model.layers.5.mlp.down_proj",
        ),
        (
            {"target_modules": ["q_proj", "k_proj"], "exclude_modules": ["k_proj"]},
            "target_modules",
            "k_proj",
        ),
        (
            {"target_modules": ["q_proj", "layers.0.mlp.down_proj"], "layers_to_transform": [1]},
            "target_modules",
            "layers.0.mlp.down_proj",
        ),
        (
            {"target_modules": ["layers.0.self_attn.q_proj"], "layers_to_transform": [0, 1]},
            "layers_to_transform",
            1,
        ),
        (
            {"exclude_modules": r"model\.layers\.1\..*", "layers_to_transform": [0, 1]},
            "layers_to_transform",
            1,
        ),
    ],
)
def test_a_selector_entry_that_selects_nothing_is_refused_by_name(
    builder, base, kit, fields: dict[str, object], field: str, value: object
) -> None:
    config = kit.config(**fields)
    with pytest.raises(AdapterConfigError) as info:
        validate_adapter_dir(builder.write(config, tensors={}), base, 16)
    assert (info.value.field, info.value.value) == (field, value)
    assert "'tiny-llama' (2 layers)" in info.value.expected


def test_every_selector_entry_that_selects_something_still_passes(builder, base, kit) -> None:
    config = kit.config(
        target_modules=["q_proj", "model.layers.1.self_attn.v_proj", "mlp.down_proj"],
        rank_pattern={"layers.0.self_attn.q_proj": 2, "q_proj": 6, r"mlp\..*": 3},
        alpha_pattern={r"model\.layers\.1\..*": 4},
        layers_to_transform=[0, 1],
        layers_pattern="layers",
    )
    adapter = validate_adapter_dir(builder.write(config), base, 8)
    ranks = {(m.layer, m.module): m.rank for m in adapter.modules}
    assert ranks == {
        (0, "q_proj"): 2,
        (1, "q_proj"): 6,
        (1, "v_proj"): 4,
        (0, "down_proj"): 3,
        (1, "down_proj"): 3,
    }


@pytest.mark.parametrize(
    ("exclude", "warned"),
    [
        (["lm_head"], "exclude_modules entries ['lm_head'] exclude none"),
        (["lm_head", "layers.1.self_attn.v_proj", "norm"], "entries ['lm_head', 'norm'] exclude"),
        (r".*\.lm_head", "exclude_modules '.*\\\\.lm_head' excludes none"),
        (["k_proj"], "exclude_modules entries ['k_proj'] exclude none"),  # not targeted
        (["layers.1.self_attn.v_proj"], None),
        (r"model\.layers\.1\.self_attn\.v_proj", None),
        ([], None),
    ],
)
def test_an_exclude_entry_that_excludes_nothing_is_accepted_with_a_warning(
    builder, base, kit, exclude: object, warned: str | None
) -> None:
    """attack24: PEFT warns when ``exclude_modules`` excludes nothing, and matches it against every
    module of the model, so ``["lm_head"]`` is valid there: accepted, never refused, but said,
    naming each entry that excludes none of the modules ``target_modules`` selects. NOTE: it
    was accepted in silence."""
    config = kit.config(target_modules=["q_proj", "v_proj"], exclude_modules=exclude)
    adapter = validate_adapter_dir(builder.write(config), base, 8)
    assert {(m.layer, m.module) for m in adapter.modules} >= {(0, "q_proj"), (0, "v_proj")}
    if warned is None:
        assert adapter.warnings == ()
        return
    (warning,) = adapter.warnings
    assert warned in warning, warning
    assert "none of the 4 modules target_modules selects in 'tiny-llama' (2 layers;" in warning
    assert "'layers.1.self_attn.v_proj'" not in warning  # it excludes one: not named


def test_rank_above_limit(builder, base, kit) -> None:
    with pytest.raises(RankTooLargeError) as info:
        validate_adapter_dir(builder.write(kit.config(r=32)), base, 16)
    assert (info.value.field, info.value.value) == ("r", 32)
    assert "max_lora_rank 16" in info.value.expected
    config = kit.config(rank_pattern={"down_proj": 32})
    with pytest.raises(RankTooLargeError) as info:
        validate_adapter_dir(builder.write(config), base, 16)
    assert info.value.field == "rank_pattern['down_proj']"
    assert "down_proj" in info.value.expected


def test_config_errors_propagate(builder, base, kit) -> None:
    with pytest.raises(AdapterConfigError) as info:
        validate_adapter_dir(builder.write(kit.config(r=0), tensors={}), base, 16)
    assert (info.value.field, info.value.value) == ("r", 0)
    with pytest.raises(ValueError, match="max_lora_rank 0"):
        validate_adapter_dir(builder.write(), base, 0)


@pytest.mark.parametrize(
    "unsafe", ["adapter_model.bin", "x.pt", "x.PTH", "optimizer.pkl", "y.pickle", "z.ckpt"]
)
def test_pickle_files_are_rejected_without_being_opened(
    builder, base, monkeypatch: pytest.MonkeyPatch, unsafe: str
) -> None:
    path = builder.write()
    (path / unsafe).write_bytes(b"\x80\x04 not really pickle")
    (path / unsafe).chmod(0)
    opened: list[str] = []
    real_open, real_io_open = builtins.open, io.open

    def spy(file: object, *args: object, **kwargs: object) -> object:
        opened.append(os.fspath(file))  # type: ignore[arg-type]
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    with pytest.raises(UnsafeFormatError, match="pickle") as info:
        validate_adapter_dir(path, base, 16)
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(io, "open", real_io_open)
    assert unsafe in str(info.value)
    assert not any(name.endswith(unsafe) for name in opened)


def test_missing_files(builder, base) -> None:
    path = builder.write()
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(CorruptArtifactError, match=r"adapter_model\.safetensors: missing"):
        validate_adapter_dir(path, base, 16)
    (path / "adapter_model.safetensors").mkdir()
    with pytest.raises(CorruptArtifactError, match="regular safetensors file"):
        validate_adapter_dir(path, base, 16)
    path = builder.write()
    (path / "adapter_config.json").unlink()
    with pytest.raises(AdapterConfigError, match=r"adapter_config\.json"):
        validate_adapter_dir(path, base, 16)
    with pytest.raises(AdapterConfigError, match="an adapter directory") as missing:
        validate_adapter_dir(path / "nope", base, 16)
    # the path is named as a path, not as a field of a config file it does not have
    assert (
        str(missing.value) == f"{path / 'nope'}: no such directory; expected an adapter directory"
    )


def test_truncated_file(builder, base) -> None:
    path = builder.write()
    weights = path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(CorruptArtifactError, match="truncated"):
        validate_adapter_dir(path, base, 16)


def test_huge_header_length_and_not_json(builder, base) -> None:
    path = builder.write(weights=(1 << 60).to_bytes(8, "little") + b"{}")
    with pytest.raises(CorruptArtifactError, match="header length"):
        validate_adapter_dir(path, base, 16)
    path = builder.write(weights=(5).to_bytes(8, "little") + b"hello")
    with pytest.raises(CorruptArtifactError, match="not valid UTF-8 JSON"):
        validate_adapter_dir(path, base, 16)


def test_offsets_overlapping_or_out_of_range(builder, base, kit) -> None:
    tensors = builder.tensors(kit.config())
    good = kit.safetensors_bytes(tensors)
    header_len = int.from_bytes(good[:8], "little")
    header = json.loads(good[8 : 8 + header_len])
    data = good[8 + header_len :]
    overlapping = dict(header)
    overlapping[Q0_B] = {**header[Q0_B], "data_offsets": header[Q0_A]["data_offsets"]}
    path = builder.write(weights=kit.raw_file(json.dumps(overlapping).encode(), data))
    with pytest.raises(CorruptArtifactError, match="overlaps"):
        validate_adapter_dir(path, base, 16)
    beyond = dict(header)
    end = len(data) + 256
    beyond[Q0_A] = {**header[Q0_A], "data_offsets": [end - 256, end]}
    path = builder.write(weights=kit.raw_file(json.dumps(beyond).encode(), data))
    with pytest.raises(CorruptArtifactError):
        validate_adapter_dir(path, base, 16)


def _replace(tensors, name, tensor):
    return {key: (tensor if key == name else value) for key, value in tensors.items()}


def test_wrong_shape(builder, base, kit) -> None:
    tensors = builder.tensors(kit.config())
    bad = kit.RawTensor("F32", (4, 8), bytes(4 * 4 * 8))
    with pytest.raises(TensorValidationError) as info:
        validate_adapter_dir(builder.write(tensors=_replace(tensors, Q0_A, bad)), base, 16)
    assert Q0_A in str(info.value) and "[4, 8]" in str(info.value) and "[4, 16]" in str(info.value)


def test_wrong_dtype_and_mixed_dtypes(builder, base, kit) -> None:
    tensors = builder.tensors(kit.config())
    int8 = kit.RawTensor("I8", (16, 4), bytes(64))
    with pytest.raises(TensorValidationError, match="dtype I8; expected one of F32, F16, BF16"):
        validate_adapter_dir(builder.write(tensors=_replace(tensors, Q0_B, int8)), base, 16)
    half = kit.RawTensor("F16", (16, 4), bytes(128))
    with pytest.raises(TensorValidationError) as info:
        validate_adapter_dir(builder.write(tensors=_replace(tensors, Q0_B, half)), base, 16)
    assert Q0_B in str(info.value) and "differs from F32" in str(info.value)


def test_missing_b_and_extra_tensor(builder, base, kit) -> None:
    tensors = builder.tensors(kit.config())
    missing = {k: v for k, v in tensors.items() if k != Q0_B}
    with pytest.raises(TensorValidationError) as info:
        validate_adapter_dir(builder.write(tensors=missing), base, 16)
    assert Q0_B in str(info.value) and "missing" in str(info.value)
    extra_names = [
        "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",  # not targeted
        "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight",  # no such layer
        "base_model.model.lm_head.lora_A.weight",
        "base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",  # wrong block
        "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
        "base_model.model.model.layers.00.self_attn.q_proj.lora_A.weight",
    ]
    for name in extra_names:
        extended = {**tensors, name: kit.RawTensor("F32", (4, 16), bytes(256))}
        with pytest.raises(TensorValidationError) as info:
            validate_adapter_dir(builder.write(tensors=extended), base, 16)
        assert repr(name) in str(info.value)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values(builder, base, kit, dtype: str, bad: float) -> None:
    tensors = builder.tensors(kit.config(), dtype)
    values = np.ones((16, 4), np.float32)
    values[3, 1] = bad
    poisoned = kit.RawTensor(dtype, (16, 4), kit.encode(values, dtype))
    with pytest.raises(TensorValidationError) as info:
        validate_adapter_dir(builder.write(tensors=_replace(tensors, Q0_B, poisoned)), base, 16)
    assert Q0_B in str(info.value) and "element 13 is NaN or infinite" in str(info.value)


def test_large_finite_bf16_and_f16_values_pass(builder, base, kit) -> None:
    for dtype, big in (("BF16", 3.0e38), ("F16", 65504.0)):
        tensors = builder.tensors(kit.config(), dtype)
        values = np.full((16, 4), -big, np.float32)
        extreme = kit.RawTensor(dtype, (16, 4), kit.encode(values, dtype))
        path = builder.write(tensors=_replace(tensors, Q0_B, extreme))
        assert validate_adapter_dir(path, base, 16).dtype in ("bfloat16", "float16")


def test_real_peft_adapter_validates_and_scales_match_peft(tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )
    model_dir = tmp_path / "tiny-peft-base"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    base = BaseModelSpec.from_dir(model_dir)
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
        rank_pattern={"v_proj": 2, "layers.1.self_attn.q_proj": 6},
        alpha_pattern={"down_proj": 3, "o_proj": 5},
        use_rslora=True,
        layers_to_transform=[0, 1],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(LlamaForCausalLM.from_pretrained(model_dir), lora)
    adapter_dir = tmp_path / "adapter"
    peft_model.save_pretrained(adapter_dir)

    adapter = validate_adapter_dir(adapter_dir, base, max_lora_rank=8)
    peft_scales = {
        name.removeprefix("base_model.model."): (module.scaling["default"], module.r["default"])
        for name, module in peft_model.named_modules()
        if isinstance(getattr(module, "scaling", None), dict) and module.scaling
    }
    ours = {
        BaseModelSpec.module_path(m.layer, m.module): (m.scale, m.rank) for m in adapter.modules
    }
    assert ours.keys() == peft_scales.keys()
    assert len(ours) == 2 * 5
    for path, (scale, rank) in ours.items():
        assert scale == pytest.approx(peft_scales[path][0], rel=1e-12)
        assert rank == peft_scales[path][1]
        layer, module = int(path.split(".")[2]), path.rsplit(".", 1)[1]
        assert adapter.spec.scale_for(layer, module) == pytest.approx(peft_scales[path][0])
    assert adapter.max_rank == 6
    assert adapter.spec.base_model_name_or_path == str(model_dir)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_byte_damage_only_raises_typed_errors(builder, base, data: st.DataObject) -> None:
    good = bytearray((builder.write() / "adapter_model.safetensors").read_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    path = builder.write(weights=bytes(good))
    try:
        adapter = validate_adapter_dir(path, base, 16)
    except (CorruptArtifactError, TensorValidationError):
        return
    assert adapter.digest == hashlib.sha256(bytes(good)).hexdigest()
