"""Serve settings that nothing would read are refused naming them, and the settings the HTTP side
checks are checked before ``serve`` or ``fleet up`` issues a key (docs/operations.md).

Each used to be taken in silence: ``max_auto_gpu_slots`` / ``auto_warm_interval_s`` with
``auto_warm = false`` (no rebalance ever ran), ``trace_sample_ratio`` / ``trace_slow_s`` /
``trace_export_names`` without ``trace_endpoint`` (no tracer), ``max_cpu_loras`` beside
``cpu_adapter_bytes`` (which won). A ``request_log_path`` in a missing directory, or a
``trace_endpoint`` without the ``otel`` extra, was refused only once the HTTP side was built:
after a first start had issued the demo tenants' keys, which were then never shown."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import app
from loraplex.cli.serve import serve_settings
from loraplex.demo.assets import DemoAssets
from loraplex.serve.assembly import build_server
from loraplex.serve.config import ServeConfig
from loraplex.serve.tracing import check_tracing_installed

URL = "http://127.0.0.1:4318/v1/traces"


def _parsed(args: list[str]) -> ServeConfig:
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return serve_settings(command.make_context("serve", args).params, {})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"auto_warm": False, "max_auto_gpu_slots": 1}, "max_auto_gpu_slots 1 is set while "
         "auto_warm is off; expected auto_warm on"),
        ({"auto_warm": False, "max_auto_gpu_slots": 0}, "max_auto_gpu_slots 0 is set while "
         "auto_warm is off"),
        ({"auto_warm": False, "auto_warm_interval_s": 2.5}, "auto_warm_interval_s 2.5 is set "
         "while auto_warm is off"),
        ({"trace_sample_ratio": 0.5}, "trace_sample_ratio 0.5 is set while trace_endpoint is "
         "unset; expected trace_endpoint set too"),
        ({"trace_slow_s": 3.0}, "trace_slow_s 3.0 is set while trace_endpoint is unset"),
        ({"trace_export_names": True}, "trace_export_names true is set while trace_endpoint is "
         "unset"),
        ({"max_cpu_loras": 8, "cpu_adapter_bytes": 1 << 20}, "max_cpu_loras 8 is set beside "
         "cpu_adapter_bytes 1048576; expected one of them"),
        ({"stream_pause_bytes": 256 << 10, "max_stream_resumes": 3}, "max_stream_resumes 3 is "
         "set while stream_pause_bytes 262144 >= max_stream_buffer_bytes 262144 \\(no stream is "
         "ever paused\\); expected stream_pause_bytes below max_stream_buffer_bytes"),
        ({"max_stream_buffer_bytes": 32 << 10, "max_paused_kv_fraction": 0.5},
         "max_paused_kv_fraction 0.5 is set while stream_pause_bytes 65536 >= "
         "max_stream_buffer_bytes 32768"),
        ({"stream_pause_bytes": 1 << 20, "max_stream_resumes": 0}, "max_stream_resumes 0 is set "
         "while stream_pause_bytes 1048576 >= max_stream_buffer_bytes 262144"),
        ({"merge_step_budget_s": 0.0, "mode": "auto"}, "merge_step_budget_s 0.0 is invalid; "
         "expected > 0"),
        ({"merge_step_budget_s": 0.03}, "merge_step_budget_s 0.03 is set while mode is "
         "unmerged"),
        ({"base_linear_kernel": "mkl"}, "base_linear_kernel 'mkl' is invalid; expected one of "
         "auto, blas, onednn, packed"),
        ({"base_linear_kernel": "packed", "device": "cuda"}, "base_linear_kernel 'packed' is "
         "invalid on device 'cuda'; expected auto or blas"),
        ({"base_linear_kernel": "onednn", "device": "cuda:1"}, "base_linear_kernel 'onednn' is "
         "invalid on device 'cuda:1'"),
        ({"base_linear_kernel": "packed", "dtype": "bfloat16"}, "base_linear_kernel 'packed' is "
         "invalid with dtype 'bfloat16'; expected auto, blas or onednn"),
    ],
)  # fmt: skip
def test_a_key_nothing_reads_is_refused_naming_it(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        ServeConfig(data_dir=tmp_path, **values)


@pytest.mark.parametrize(
    "values",
    [
        {"auto_warm": False},
        {"max_auto_gpu_slots": 1, "auto_warm_interval_s": 2.5},
        {"trace_endpoint": URL, "trace_sample_ratio": 0.5, "trace_slow_s": 3.0},
        {"trace_endpoint": URL, "trace_export_names": True},
        {"max_cpu_loras": 8},
        {"cpu_adapter_bytes": 1 << 20},
        {"stream_pause_bytes": 1 << 20},  # pausing off (the overflow abort alone bounds)
        {"stream_pause_bytes": 16 << 10, "max_stream_resumes": 3, "max_paused_kv_fraction": 0.5},
        {
            "max_stream_buffer_bytes": 1 << 20,
            "stream_pause_bytes": 512 << 10,
            "max_stream_resumes": 0,
        },
        {"base_linear_kernel": "onednn", "dtype": "bfloat16"},
        {"base_linear_kernel": "blas", "device": "cuda"},
        {"base_linear_kernel": "packed"},
        {"merge_step_budget_s": 0.03, "mode": "auto"},
    ],
)
def test_the_same_keys_pass_where_something_reads_them(
    tmp_path: Path, values: dict[str, Any]
) -> None:
    config = ServeConfig(data_dir=tmp_path, **values)
    assert all(getattr(config, key) == value for key, value in values.items())


def test_serve_refuses_the_pair_on_its_command_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    args = ["serve", "--data-dir", str(tmp_path), "--no-auto-warm", "--max-auto-gpu-slots", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # the box's wrap
    assert "max_auto_gpu_slots 1 is set while auto_warm is off" in said
    assert not (tmp_path / "registry.sqlite3").exists()  # nothing started, no key issued


def test_a_request_log_in_a_missing_directory_is_refused_before_start(tmp_path: Path) -> None:
    where = tmp_path / "absent" / "requests.jsonl"
    with pytest.raises(ValueError, match=r"^request_log_path .* its directory does not exist"):
        ServeConfig(data_dir=tmp_path, request_log_path=where).check_request_log_path()
    config = tmp_path / "serve.toml"
    config.write_text('[serve]\nrequest_log_path = "absent/requests.jsonl"\n')
    with pytest.raises(ValueError, match=r"^request_log_path .* its directory does not exist"):
        _parsed(["--data-dir", str(tmp_path), "--config", str(config)])
    result = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path), "--config", str(config)]
    )
    assert result.exit_code == 2 and "request_log_path" in result.output, result.output
    assert not (tmp_path / "registry.sqlite3").exists()  # nothing started, no key issued
    (tmp_path / "absent").mkdir()
    assert _parsed(["--data-dir", str(tmp_path), "--config", str(config)]).request_log_path == (
        where
    )


def test_a_request_log_that_cannot_be_appended_to_is_refused_naming_it(tmp_path: Path) -> None:
    folder = tmp_path / "requests.jsonl"
    folder.mkdir()  # a directory where the file should be: open("a") fails whoever runs this
    with pytest.raises(ValueError, match=r"^request_log_path .* cannot be appended to"):
        ServeConfig(data_dir=tmp_path, request_log_path=folder).check_request_log_path()


def test_a_trace_endpoint_without_the_extra_is_refused_before_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def without_exporter(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "loraplex.tracing.exporter":
            raise ImportError("No module named 'opentelemetry'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_exporter)
    monkeypatch.delitem(sys.modules, "loraplex.tracing.exporter", raising=False)
    config = ServeConfig(data_dir=tmp_path, trace_endpoint=URL)
    with pytest.raises(ValueError, match=r"^trace_endpoint .* needs OpenTelemetry"):
        check_tracing_installed(config)
    with pytest.raises(ValueError, match=r"^trace_endpoint .* needs OpenTelemetry"):
        _parsed(["--data-dir", str(tmp_path), "--config", str(_toml(tmp_path, URL))])
    check_tracing_installed(ServeConfig(data_dir=tmp_path))  # off: nothing to import


def _toml(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(f'[serve]\ntrace_endpoint = "{url}"\n')
    return path


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gpu_adapter_bytes": 1}, "gpu_adapter_bytes 1 is invalid; expected at least one slot"),
        ({"max_loras": 4, "gpu_adapter_bytes": None, "max_auto_gpu_slots": 3}, None),
    ],
)
def test_gpu_slot_budgets_are_refused_before_the_registry_opens(
    demo_assets: DemoAssets, tmp_path: Path, values: dict[str, Any], message: str | None
) -> None:
    """They were found by the engine side (its process, or its thread), after the registry was
    opened and a first start had issued and announced the demo tenants' keys."""
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    slot = ServeConfig(data_dir=tmp_path).slot_bytes(base)
    if message is None:  # 3 automatic slots of the 3 that 3 slots' bytes leave
        values = {**values, "gpu_adapter_bytes": 3 * slot}
        message = "max_auto_gpu_slots 3 is invalid; expected fewer than the 3 GPU slots"
    config = ServeConfig(
        data_dir=tmp_path / "data", model=demo_assets.base_model_dir, demo=False,
        engine_process=False, torch_threads=1, **values,
    )  # fmt: skip
    with pytest.raises(ValueError, match=f"^{message}"):
        build_server(config)
    assert not (tmp_path / "data" / "registry.sqlite3").exists()
