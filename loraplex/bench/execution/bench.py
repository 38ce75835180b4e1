"""The execution benchmark's entry: the headline comparison, then (optionally) the matrix."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from loraplex.bench.execution.headline import headline, matrix_rows
from loraplex.bench.execution.runners import KV_BLOCK_SIZE, KV_CACHE
from loraplex.bench.execution.setup import (
    DTYPES,
    UNIFORM_MIX,
    Case,
    ExecutionBenchConfig,
    Workspace,
    seq_slots,
)
from loraplex.engine.heap import keep_freed_heap
from loraplex.model.layers import resolve_linear_kernel

__all__ = ["Case", "ExecutionBenchConfig", "run_execution_bench", "seq_slots"]


def run_execution_bench(
    config: ExecutionBenchConfig, workdir: Path | None = None
) -> dict[str, object]:
    """Run the benchmark; returns the JSON-line object (name, config, seed, metrics, rows)."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' is invalid here: torch sees no CUDA device")
    # As the server's engine process does (serve/engine_side.py): steps keep the activations
    # they free instead of faulting them in again. Both sides run in this process, so both get it.
    heap_kept = keep_freed_heap()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        cases = _matrix_cases(config) if config.matrix else []
        num_adapters = max([16, *[c.active for c in cases]])
        # The headline reads two mixes; the matrix may read every one.
        mixes = None if cases else ("S2", UNIFORM_MIX)
        space = Workspace.create(Path(tmp), config.preset, num_adapters, config.seed, mixes)
        metrics: dict[str, object] = {}
        rows: list[dict[str, object]] = []
        for dtype_name in config.dtypes:
            found, headline_rows = headline(config, space, dtype_name)
            suffix = "" if dtype_name == "float32" else f"_{dtype_name}"
            metrics.update({f"{key}{suffix}": value for key, value in found.items()})
            rows.extend(headline_rows)
        if cases:
            rows.extend(matrix_rows(config, space, cases))
    return {
        "name": "execution",
        "config": {
            "preset": config.preset,
            "dtypes": list(config.dtypes),
            "context_tokens": config.context_tokens,
            "rounds": config.rounds,
            "calls_per_round": config.calls_per_round,
            "matrix": config.matrix,
            "peft": config.peft,
            "threads": torch.get_num_threads(),
            "device": config.device,
            "device_name": _device_name(config.device),
            "backend": config.backend,
            "batch_size": config.batch_size,
            "torch": torch.__version__,
            "kv_cache": KV_CACHE,  # loraplex's side: the server's paged cache
            "kv_block_size": KV_BLOCK_SIZE,
            "batch_build_timed": True,  # both sides time their own input preparation
            "heap_kept": heap_kept,  # engine/heap.py's malloc thresholds, as in the server
            "linear_kernels": {  # what loraplex's base linears ran on, per dtype
                name: resolve_linear_kernel("auto", DTYPES[name], torch.device(config.device))
                for name in config.dtypes
            },
        },
        "seed": config.seed,
        "metrics": metrics,
        "rows": rows,
    }


def _device_name(device: str) -> str | None:
    """The accelerator's name, so a recorded line says what it ran on (None on the CPU)."""
    return torch.cuda.get_device_name(0) if device == "cuda" else None


def _matrix_cases(config: ExecutionBenchConfig) -> list[Case]:
    base = Case()
    cases = [base]
    for axis, values in config.matrix_axes.items():
        for value in values:
            case = replace(base, **{axis: value})  # type: ignore[arg-type]
            if axis == "active":  # room for every active adapter in one batch
                case = replace(case, batch_size=max(base.batch_size, case.active))
            if axis == "batch_size":  # no more adapters than sequences
                case = replace(case, active=min(base.active, case.batch_size))
            if case not in cases:
                cases.append(case)
    return cases
