"""``loraplex serve`` configuration: TOML file, flag precedence, byte budgets, bootstrap state."""

from __future__ import annotations

import math
import stat
import typing
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

import pytest
import typer
from conftest import Served
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec, lora_bytes
from loraplex.cli import app
from loraplex.cli.serve import serve_settings
from loraplex.demo.assets import DemoAssets
from loraplex.dtypes import DTYPE_NAMES
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.registry import open_registry
from loraplex.residency.policy import DEFAULT_POLICY, policy_names
from loraplex.serve.assembly import build_server
from loraplex.serve.bootstrap import ADMIN_KEY_FILE, admin_key, register_demo, sample_keys
from loraplex.serve.config import (
    DEFAULT_CPU_ADAPTER_BYTES,
    ServeConfig,
    memory_total_bytes,
    merge,
    read_config_file,
)
from loraplex.serve.engine_settings import engine_config, registry_config
from loraplex.server.deps import ServerConfig

LOCATION_VARIABLES = ("LORAPLEX_DATABASE_URL", "LORAPLEX_STORE", "LORAPLEX_S3_ENDPOINT")


def parsed_serve(args: list[str], environ: dict[str, str]) -> ServeConfig:
    """The settings ``loraplex serve ARGS`` would run with (parsed, nothing started)."""
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    context = command.make_context("serve", args)
    return serve_settings(context.params, environ)


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
    with pytest.raises(ValueError, match="unknown keys \\['max_lora'\\]") as unknown:
        read_config_file(path)
    assert "(max_lora: did you mean max_loras?)" in str(unknown.value)
    # keys above a [serve] table were read by nothing, in silence (the port stayed 8000)
    path.write_text("port = 9000\n[serve]\nmax_loras = 4\n")
    with pytest.raises(ValueError, match="keys \\['port'\\] are outside the \\[serve\\] table"):
        read_config_file(path)
    path.write_text("[serve]\nmax_loras = 4\n[fleet]\nreplicas = 2\n")
    assert read_config_file(path, ("fleet",)) == {"max_loras": 4}
    with pytest.raises(ValueError, match="policy 'fifo' is invalid"):
        ServeConfig(data_dir=tmp_path, policy="fifo")
    with pytest.raises(ValueError, match="max_loras 0 is invalid"):
        ServeConfig(data_dir=tmp_path, max_loras=0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "0"], r"^threads 0 is invalid"),  # the flag's name, not torch_threads
        (["--config", "c.toml"], "class_reserve_seqs -3 is invalid"),
        (["--max-model-len", "100000"], "num_kv_blocks 1024 x block_size 16 is invalid"),
    ],
)
def test_engine_settings_are_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    """The engine's own checks used to run only in its child process, after the server had
    announced itself and issued keys (and a ValueError there left it answering 503 forever)."""
    (tmp_path / "c.toml").write_text("class_reserve_seqs = -3\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        parsed_serve(["--data-dir", str(tmp_path), *args], {})


def test_byte_budgets(demo_assets: DemoAssets, tmp_path: Path) -> None:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    config = ServeConfig(data_dir=tmp_path, max_lora_rank=8, max_loras=8)
    modules = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    per_layer = sum(sum(base.module_shape(m)) for m in modules)
    slot = per_layer * base.num_layers * 8 * 4
    assert config.slot_bytes(base) == slot == lora_bytes(base, 8, 4)
    assert ServeConfig(data_dir=tmp_path, max_lora_rank=8, dtype="bfloat16").slot_bytes(base) == (
        slot // 2
    )
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
        ServeConfig(data_dir=tmp_path, max_lora_rank=8, max_cpu_loras=9).cpu_bytes(base) == 9 * slot
    )
    assert ServeConfig(data_dir=tmp_path, cpu_adapter_bytes=1234).cpu_bytes(base) == 1234


def test_automatic_gpu_slots(demo_assets: DemoAssets, tmp_path: Path) -> None:
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    assert ServeConfig(data_dir=tmp_path).auto_gpu_slots(base) == 2  # 8 // 4
    assert ServeConfig(data_dir=tmp_path, max_loras=3).auto_gpu_slots(base) == 0
    assert ServeConfig(data_dir=tmp_path, max_auto_gpu_slots=7).auto_gpu_slots(base) == 7
    for bad in (-1, 8):
        with pytest.raises(ValueError, match=f"max_auto_gpu_slots {bad} is invalid; expected 0"):
            ServeConfig(data_dir=tmp_path, max_auto_gpu_slots=bad)
    slot = ServeConfig(data_dir=tmp_path, max_lora_rank=8).slot_bytes(base)
    fewer = ServeConfig(
        data_dir=tmp_path, max_lora_rank=8, gpu_adapter_bytes=3 * slot, max_auto_gpu_slots=3
    )
    with pytest.raises(ValueError, match="fewer than the 3 GPU slots gpu_adapter_bytes"):
        fewer.auto_gpu_slots(base)
    flags = parsed_serve(["--data-dir", str(tmp_path), "--max-auto-gpu-slots", "1"], {})
    assert flags.max_auto_gpu_slots == 1


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


def test_policy_and_dtype_names_come_from_their_one_source(tmp_path: Path) -> None:
    assert ServeConfig(data_dir=tmp_path).policy == DEFAULT_POLICY
    for name in policy_names():
        assert ServeConfig(data_dir=tmp_path, policy=name).policy == name
    for name in DTYPE_NAMES:
        assert ServeConfig(data_dir=tmp_path, dtype=name).dtype == name
    with pytest.raises(ValueError, match="dtype 'float64' is invalid; expected one of"):
        ServeConfig(data_dir=tmp_path, dtype="float64")


def test_step_token_budget_is_a_setting(tmp_path: Path) -> None:
    default = ServeConfig(data_dir=tmp_path, max_num_seqs=8)
    assert engine_config(default).scheduler.max_num_batched_tokens == 512
    many = ServeConfig(data_dir=tmp_path, max_num_seqs=600)
    assert engine_config(many).scheduler.max_num_batched_tokens == 600
    chosen = ServeConfig(data_dir=tmp_path, max_num_seqs=8, max_num_batched_tokens=96)
    assert engine_config(chosen).scheduler.max_num_batched_tokens == 96
    with pytest.raises(ValueError, match="max_num_batched_tokens 4 is invalid; expected >= "):
        ServeConfig(data_dir=tmp_path, max_num_seqs=8, max_num_batched_tokens=4)


def test_new_flags_and_toml_keys_reach_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[serve]\nmax_num_batched_tokens = 128\nauto_warm = false\n")
    args = [
        "--config",
        str(path),
        "--data-dir",
        str(tmp_path),
        "--max-concurrent-loads",
        "6",
        "--tenant-max-concurrent-loads",
        "3",
    ]
    settings = parsed_serve(args, {})
    assert (settings.max_num_batched_tokens, settings.auto_warm) == (128, False)
    assert (settings.max_concurrent_loads, settings.tenant_max_concurrent_loads) == (6, 3)
    interval = ["--auto-warm-interval-s", "2.5"]
    flags = parsed_serve([*args, *interval, "--max-num-batched-tokens", "64", "--auto-warm"], {})
    assert (flags.max_num_batched_tokens, flags.auto_warm) == (64, True)
    assert flags.auto_warm_interval_s == 2.5
    assert parsed_serve(["--data-dir", str(tmp_path)], {}).auto_warm is True
    with pytest.raises(ValueError, match="tenant_max_concurrent_loads 0 is invalid"):
        ServeConfig(data_dir=tmp_path, tenant_max_concurrent_loads=0)


def test_serve_reads_the_registry_location_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry commands and ``serve`` given the same environment open the same registry."""
    env = {
        "LORAPLEX_DATA_DIR": str(tmp_path / "data"),
        "LORAPLEX_DATABASE_URL": f"sqlite:///{tmp_path / 'elsewhere' / 'registry.db'}",
        "LORAPLEX_STORE": str(tmp_path / "store"),
    }
    (tmp_path / "elsewhere").mkdir()
    created = CliRunner().invoke(app, ["tenants", "create", "acme"], env=env)
    assert created.exit_code == 0, created.output
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = parsed_serve([], env)
    assert (settings.database_url, settings.store) == (
        env["LORAPLEX_DATABASE_URL"],
        env["LORAPLEX_STORE"],
    )
    registry = open_registry(registry_config(settings))
    try:
        assert [t.name for t in registry.list_tenants()] == ["acme"]
    finally:
        registry.close()
    assert not (tmp_path / "data" / "registry.sqlite3").exists()
    monkeypatch.setenv("LORAPLEX_STORE", "s3://bucket/prefix")
    monkeypatch.setenv("LORAPLEX_S3_ENDPOINT", "http://127.0.0.1:9000")
    s3 = registry_config(parsed_serve([], env))
    assert (s3.store_url, s3.s3_endpoint) == ("s3://bucket/prefix", "http://127.0.0.1:9000")
    flagged = parsed_serve(["--store", str(tmp_path / "flag-store")], env)
    assert flagged.store == str(tmp_path / "flag-store")  # a flag wins over its variable


def test_shared_state_key_and_flag_reach_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(
        '[serve]\nshared_state_url = "redis://:hunter2@cache:6379/1"\n'
        'shared_state_prefix = "blue"\n'
    )
    base = ["--config", str(path), "--data-dir", str(tmp_path)]
    from_file = parsed_serve(base, {})
    assert (from_file.shared_state_url, from_file.shared_state_prefix) == (
        "redis://:hunter2@cache:6379/1",
        "blue",
    )
    assert "hunter2" not in repr(from_file)
    flags = ["--shared-state-url", "rediss://cache:6380/0", "--shared-state-prefix", "green"]
    flagged = parsed_serve([*base, *flags], {})  # a flag wins over the file
    assert (flagged.shared_state_url, flagged.shared_state_prefix) == (
        "rediss://cache:6380/0",
        "green",
    )
    default = parsed_serve(["--data-dir", str(tmp_path)], {})
    assert (default.shared_state_url, default.shared_state_prefix) == (None, "loraplex")


def test_a_shared_state_prefix_without_its_redis_is_refused(tmp_path: Path) -> None:
    """The prefix names keys in the Redis of ``shared_state_url``; set alone (the URL mistyped
    out of a file, or its flag forgotten) it was taken and did nothing: every process kept its
    own buckets. Now it is refused, naming both settings; the default prefix alone is fine."""
    with pytest.raises(
        ValueError, match="shared_state_prefix 'blue' is set without shared_state_url"
    ):
        ServeConfig(data_dir=tmp_path, shared_state_prefix="blue")
    with pytest.raises(ValueError, match="shared_state_prefix 'green' is set without"):
        ServerConfig("base", "admin-key-of-16-chars", shared_state_prefix="green")
    assert ServeConfig(data_dir=tmp_path).shared_state_prefix == "loraplex"
    paired = ServeConfig(
        data_dir=tmp_path, shared_state_url="redis://cache", shared_state_prefix="b"
    )
    assert paired.shared_state_prefix == "b"


def test_a_bad_shared_state_setting_is_refused_without_its_password(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shared_state_url scheme 'http' is invalid"):
        ServeConfig(data_dir=tmp_path, shared_state_url="http://:hunter2@cache")
    with pytest.raises(ValueError, match="shared_state_url of type int is invalid"):
        ServeConfig(data_dir=tmp_path, shared_state_url=6379)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shared_state_prefix 'a b' is invalid"):
        ServeConfig(data_dir=tmp_path, shared_state_prefix="a b")
    args = ["serve", "--data-dir", str(tmp_path), "--shared-state-url", "tcp://:hunter2@cache"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "shared_state_url scheme 'tcp' is invalid" in result.output
    assert "hunter2" not in result.output


def _float_keys() -> list[str]:
    hints = typing.get_type_hints(ServeConfig)
    return [
        f.name
        for f in fields(ServeConfig)
        if float in typing.get_args(hints[f.name]) or hints[f.name] is float
    ]


@pytest.mark.parametrize("key", _float_keys())
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_key_refuses_nan_and_infinity(tmp_path: Path, key: str, value: float) -> None:
    """``inf`` passed every ``> 0`` / ``>= 0`` check (``queue_deadline_s``, ``step_work_ratio``)
    and NaN every negated one; no setting documents infinity as "no limit"."""
    with pytest.raises(ValueError, match=f"^{key} {value} is invalid; expected a finite number"):
        ServeConfig(data_dir=tmp_path, **{key: value})


@pytest.mark.parametrize("key", ["queue_deadline_s", "step_work_ratio"])
@pytest.mark.parametrize("literal", ["inf", "+inf", "-inf", "nan"])
def test_a_config_file_or_flag_infinity_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, literal: str
) -> None:
    (tmp_path / "c.toml").write_text(f"{key} = {literal}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"^{key} .* expected a finite number"):
        parsed_serve(["--data-dir", str(tmp_path), "--config", "c.toml"], {})
    if key == "queue_deadline_s":  # step_work_ratio is a config file key only
        with pytest.raises(ValueError, match=f"^{key} .* expected a finite number"):
            parsed_serve(["--data-dir", str(tmp_path), "--queue-deadline-s", literal], {})


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda v: SchedulerConfig(default_deadline_s=v), "default_deadline_s"),
        (lambda v: SchedulerConfig(step_work_ratio=v), "step_work_ratio"),
        (lambda v: SchedulerConfig(max_paused_kv_fraction=v), "max_paused_kv_fraction"),
        (lambda v: SchedulerConfig(retry_hint_s=v), "retry_hint_s"),
        (lambda v: EngineConfig(idle_wait_s=v), "idle_wait_s"),
    ],
)
def test_engine_settings_refuse_nan_and_infinity(make: Callable[[float], object], key: str) -> None:
    for value in (math.nan, math.inf):
        with pytest.raises(ValueError, match=f"^{key} {value} is invalid"):
            make(value)


def test_a_kv_cache_larger_than_the_machine_is_refused_before_start(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """``block_size = 1000000`` used to fail in the engine process with an out-of-memory error,
    after the server had announced itself and issued keys."""
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    config = ServeConfig(data_dir=tmp_path, block_size=1_000_000)
    need = config.kv_bytes(base)
    assert need == 2 * base.num_layers * (1024 * 1_000_000 + 1) * base.num_kv_heads * (
        base.head_dim * 4
    )
    with pytest.raises(
        ValueError,
        match=rf"^num_kv_blocks 1024 x block_size 1000000 is invalid; its KV cache needs {need} "
        r"bytes, more than this machine's 1073741824 bytes",
    ):
        config.check_kv_memory(base, 1 << 30)
    config.check_kv_memory(base, need)  # fits exactly
    config.check_kv_memory(base, None)  # memory unknown: the engine start checks
    replace(config, device="cuda").check_kv_memory(base, 1 << 30)  # GPU memory: the engine's


def test_the_kv_caches_of_replicas_on_one_machine_must_fit_it_together(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """``fleet up``'s local Ray head runs every replica here, each with its own KV cache."""
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    config = ServeConfig(data_dir=tmp_path)
    each = config.kv_bytes(base)
    config.check_kv_memory(base, 3 * each, replicas=3)  # fits exactly
    rows = (3 * each) // 4 // config.kv_bytes(base, rows=0)
    with pytest.raises(ValueError) as refused:
        config.check_kv_memory(base, 3 * each, replicas=4)
    assert str(refused.value) == (
        f"num_kv_blocks 1024 x block_size 16 is invalid with 4 replicas on this machine; their "
        f"KV caches need 4 x {each} = {4 * each} bytes, more than this machine's {3 * each} "
        f"bytes of memory (expected num_kv_blocks x block_size below {rows} tokens per "
        "replica, or fewer replicas)"
    )
    assert rows < 1024 * 16
    replace(config, num_kv_blocks=rows // 16 - 1).check_kv_memory(base, 3 * each, replicas=4)
    config.check_kv_memory(base, None, replicas=4)  # memory unknown


def test_memory_total_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072 kB\nMemFree:        1024 kB\n")
    assert memory_total_bytes(meminfo) == 131072 * 1024
    assert memory_total_bytes(tmp_path / "absent") is None


@pytest.mark.parametrize("kind", ["absent", "file"])
def test_an_import_dir_that_is_not_a_directory_is_refused_before_start(
    tmp_path: Path, kind: str
) -> None:
    """It used to start, then answer every registration by path with a 500 internal_error
    (``os.open`` of the missing root raised FileNotFoundError)."""
    where = tmp_path / "imports"
    if kind == "file":
        where.write_text("not a folder")
    with pytest.raises(ValueError, match=rf"^import_dir {where} is invalid; expected a directory"):
        parsed_serve(["--data-dir", str(tmp_path), "--import-dir", str(where)], {})
    config = tmp_path / "serve.toml"
    config.write_text(f'[serve]\nimport_dir = "{where.name}"\n')
    with pytest.raises(ValueError, match=r"^import_dir .* is invalid"):
        parsed_serve(["--data-dir", str(tmp_path), "--config", str(config)], {})
    result = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path), "--import-dir", str(where)]
    )
    assert result.exit_code != 0 and "import_dir" in result.output
    assert not (tmp_path / "registry.sqlite3").exists()  # nothing started, no key issued
    where.unlink(missing_ok=True)
    where.mkdir()
    assert (
        parsed_serve(["--data-dir", str(tmp_path), "--import-dir", str(where)], {}).import_dir
        == where
    )


def test_max_paused_kv_fraction_is_a_config_file_key_checked_and_passed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("max_paused_kv_fraction = 0.5\n")
    config = parsed_serve(["--data-dir", str(tmp_path), "--config", "c.toml"], {})
    assert engine_config(config).scheduler.max_paused_kv_fraction == 0.5
    assert ServeConfig(data_dir=tmp_path).max_paused_kv_fraction == 0.25
    for bad in ("1.5", "-0.1"):
        (tmp_path / "c.toml").write_text(f"max_paused_kv_fraction = {bad}\n")
        with pytest.raises(ValueError, match=f"^max_paused_kv_fraction {bad} is invalid"):
            parsed_serve(["--data-dir", str(tmp_path), "--config", "c.toml"], {})


def test_the_first_start_says_it_generates_the_demo_set(
    demo_assets: DemoAssets, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo set's training printed nothing for minutes before the keys: a line says so, on
    the start that generates it only (not with a model of one's own, nor once it is there)."""
    from loraplex.cli.serve_start import say_demo_generation

    fresh = ServeConfig(data_dir=tmp_path / "fresh")
    say_demo_generation(fresh)
    line = capsys.readouterr().err
    assert (
        f"generating the demo model and adapters into {tmp_path / 'fresh' / 'demo-assets'}" in line
    )
    say_demo_generation(replace(fresh, model=demo_assets.base_model_dir))
    (tmp_path / "ready").mkdir()
    (tmp_path / "ready" / "demo-assets").symlink_to(demo_assets.root)
    say_demo_generation(ServeConfig(data_dir=tmp_path / "ready"))
    assert capsys.readouterr() == ("", "")


def test_a_max_model_len_past_the_models_context_is_refused_before_start(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """The demo model's ``max_position_embeddings`` is 512: ``max_model_len`` 513 was accepted
    in silence (vLLM refuses it), with positions past those the model was trained for."""
    data_dir = tmp_path / "data"
    model = demo_assets.base_model_dir
    config = ServeConfig(data_dir=data_dir, model=model, demo=False, max_model_len=513)
    message = (
        r"^max_model_len 513 is invalid; expected at most 512, the model's context "
        r"\(max_position_embeddings 512 in its config.json\)$"
    )
    with pytest.raises(ValueError, match=message):
        build_server(config, wait_engine=False).close()
    assert not (data_dir / ADMIN_KEY_FILE).exists()  # before a key, or the registry
    assert list(data_dir.iterdir()) == []
