"""``loraplex serve`` configuration: TOML file, flag precedence, byte budgets, bootstrap state."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from conftest import Served
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import app
from loraplex.demo.assets import DemoAssets
from loraplex.serve.bootstrap import ADMIN_KEY_FILE, admin_key, register_demo, sample_keys
from loraplex.serve.config import (
    DEFAULT_CPU_ADAPTER_BYTES,
    ServeConfig,
    merge,
    read_config_file,
)


def test_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('[serve]\nport = 9000\nmax_loras = 2\ndata_dir = "state"\npolicy = "lru"\n')
    values = read_config_file(path)
    assert values["data_dir"] == tmp_path / "state"
    config = merge(values, {"port": 9100, "max_loras": None, "host": "0.0.0.0"})
    assert (config.port, config.max_loras, config.policy, config.host) == (
        9100,
        2,
        "lru",
        "0.0.0.0",
    )


def test_unknown_keys_and_bad_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("max_lora = 3\n")
    with pytest.raises(ValueError, match="unknown keys \\['max_lora'\\]"):
        read_config_file(path)
    with pytest.raises(ValueError, match="policy 'fifo' is invalid"):
        ServeConfig(data_dir=tmp_path, policy="fifo")
    with pytest.raises(ValueError, match="max_loras 0 is invalid"):
        ServeConfig(data_dir=tmp_path, max_loras=0)


def test_byte_budgets(demo_assets: DemoAssets, tmp_path: Path) -> None:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    config = ServeConfig(data_dir=tmp_path, max_lora_rank=8, max_loras=8)
    modules = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    per_layer = sum(sum(base.module_shape(m)) for m in modules)
    slot = per_layer * base.num_layers * 8 * 4
    assert config.slot_bytes(base) == slot
    assert config.gpu_slots(base) == 8
    assert (
        ServeConfig(data_dir=tmp_path, max_lora_rank=8, gpu_adapter_bytes=3 * slot + 1).gpu_slots(
            base
        )
        == 3
    )
    with pytest.raises(ValueError, match="gpu_adapter_bytes"):
        ServeConfig(data_dir=tmp_path, max_lora_rank=8, gpu_adapter_bytes=slot - 1).gpu_slots(base)
    assert config.cpu_bytes(base) == DEFAULT_CPU_ADAPTER_BYTES
    assert (
        ServeConfig(data_dir=tmp_path, max_lora_rank=8, max_cpu_loras=5).cpu_bytes(base) == 5 * slot
    )
    both = ServeConfig(data_dir=tmp_path, max_cpu_loras=5, cpu_adapter_bytes=1234)
    assert both.cpu_bytes(base) == 1234


def test_cli_rejects_a_bad_config_before_starting(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[serve]\nworkers = 4\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(path), "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown keys" in result.output


def test_bootstrap_is_idempotent(served: Served, tmp_path: Path) -> None:
    again = register_demo(served.registry, served.assets)
    assert [r.ref for r in again.revisions] == [r.ref for r in served.demo.revisions]
    # Every demo tenant holds an active key already: none is issued (keys are shown once).
    assert sample_keys(served.registry, again.tenants, tmp_path) == {}


def test_admin_key_is_generated_once(tmp_path: Path) -> None:
    key = admin_key(tmp_path)
    assert admin_key(tmp_path) == key and not key.startswith("lpx_") and len(key) > 32
    assert stat.S_IMODE((tmp_path / ADMIN_KEY_FILE).stat().st_mode) == 0o600
