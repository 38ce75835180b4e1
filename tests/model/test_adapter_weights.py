"""L2 -> L1: a validated adapter directory read into CPU tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.errors import CorruptArtifactError
from loraplex.model.adapter_weights import load_adapter_weights


def test_tensors_equal_the_file_in_execution_order(builder, base, kit) -> None:  # type: ignore[no-untyped-def]
    config = kit.config(
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2},
        alpha_pattern={"down_proj": 3},
    )
    adapter_dir = builder.write(config)
    validated = validate_adapter_dir(adapter_dir, base, max_lora_rank=8)
    weights = load_adapter_weights(validated, dtype=torch.float32)
    stored = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert weights.digest == validated.digest
    assert [(m.layer, m.module) for m in weights.modules] == [
        (layer, module) for layer in range(2) for module in ("q_proj", "v_proj", "down_proj")
    ]
    for pair in weights.modules:
        prefix = f"base_model.model.{base.module_path(pair.layer, pair.module)}"
        assert torch.equal(pair.lora_a, stored[f"{prefix}.lora_A.weight"])
        assert torch.equal(pair.lora_b, stored[f"{prefix}.lora_B.weight"])
        assert pair.scale == validated.spec.scale_for(pair.layer, pair.module)
    ranks = {m.module: m.rank for m in weights.modules}
    assert ranks == {"q_proj": 4, "v_proj": 2, "down_proj": 4}
    scales = {m.module: m.scale for m in weights.modules}
    assert scales == {"q_proj": 2.0, "v_proj": 4.0, "down_proj": 0.75}
    assert weights.num_bytes == validated.tensor_bytes
    assert weights.max_rank == 4


@pytest.mark.parametrize(
    ("stored", "wanted"), [("BF16", torch.float32), ("F32", torch.bfloat16), ("F16", torch.float16)]
)
def test_dtype_conversion(builder, kit, stored: str, wanted: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    config = kit.config()
    adapter_dir = builder.write(config, tensors=builder.tensors(config, dtype=stored))
    validated = validate_adapter_dir(adapter_dir, builder.base, max_lora_rank=8)
    weights = load_adapter_weights(validated, dtype=wanted)
    reference = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert all(m.lora_a.dtype == wanted and m.lora_b.dtype == wanted for m in weights.modules)
    first = weights.modules[0]
    name = f"base_model.model.{builder.base.module_path(first.layer, first.module)}.lora_A.weight"
    assert torch.equal(first.lora_a, reference[name].to(wanted))


def test_truncated_after_validation_is_a_typed_error(builder) -> None:  # type: ignore[no-untyped-def]
    adapter_dir: Path = builder.write()
    validated = validate_adapter_dir(adapter_dir, builder.base, max_lora_rank=8)
    path = adapter_dir / "adapter_model.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CorruptArtifactError, match="file ends"):
        load_adapter_weights(validated, dtype=torch.float32)


@pytest.mark.gpu
def test_pinned_buffers(builder) -> None:  # type: ignore[no-untyped-def]
    validated = validate_adapter_dir(builder.write(), builder.base, max_lora_rank=8)
    weights = load_adapter_weights(validated, dtype=torch.float32, pin_memory=True)
    assert all(m.lora_a.is_pinned() and m.lora_b.is_pinned() for m in weights.modules)


def test_modules_are_views_of_packed_runs(builder, base, kit) -> None:  # type: ignore[no-untyped-def]
    config = kit.config(
        target_modules=["q_proj", "v_proj"], rank_pattern={"layers.1.self_attn.v_proj": 2}
    )
    validated = validate_adapter_dir(builder.write(config), base, max_lora_rank=8)
    weights = load_adapter_weights(validated, dtype=torch.float32)
    runs = {(r.module, r.first_layer): (r.num_layers, r.rank) for r in weights.runs}
    assert runs == {("q_proj", 0): (2, 4), ("v_proj", 0): (1, 4), ("v_proj", 1): (1, 2)}
    for run in weights.runs:
        for i in range(run.num_layers):
            module = next(
                m
                for m in weights.modules
                if (m.layer, m.module) == (run.first_layer + i, run.module)
            )
            assert module.lora_a.data_ptr() == run.lora_a[i].data_ptr()
            assert torch.equal(module.lora_b.T, run.lora_b_t[i])
