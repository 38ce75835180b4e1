"""A comparator's server: ``loraplex serve`` on one model directory, as a subprocess, with a
registry of its own that holds one tenant and nothing else (torch-free: the model loads in the
server's process, never in this one).

The server is started through the bench harness (free port, log file kept, process group
stopped), and the launch instant is recorded so the caller can time the cold start: process
start to first answer, a full model load included.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.bench.harness.process import (
    Launch,
    free_port,
    own_env,
    serve_command,
    serving_process,
)
from loraplex.bench.proc_tree import descendants_of
from loraplex.registry import RegistryConfig, open_registry
from loraplex.serve.config import file_key

TENANT = "qualify"  # the one tenant of a comparator's registry
_ACTOR = "qualify-baselines"


@dataclass(frozen=True)
class ServerSpec:
    """One comparator server: which model it serves and with which limits."""

    model_dir: Path  # a Hugging Face checkpoint directory, served as the base model
    data_dir: Path  # a fresh directory: registry, logs, secrets
    max_model_len: int  # prompt + output tokens of one sequence
    torch_threads: int = 1  # the same on every side (shared cores)
    max_num_seqs: int = 32  # sequences decoding at once
    start_timeout_s: float = 300.0  # start to ready

    def __post_init__(self) -> None:
        for name in ("max_model_len", "torch_threads", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerSpec.{name} must be >= 1, got {getattr(self, name)}")
        if not self.start_timeout_s > 0:
            raise ValueError(f"ServerSpec.start_timeout_s must be > 0, got {self.start_timeout_s}")


@dataclass(frozen=True)
class Running:
    """A started comparator server."""

    url: str  # base URL
    pid: int  # the server process (its engine runs in a child)
    key: str  # the tenant's API key
    model: str  # the name requests give for the base model
    launched_at: float  # time.monotonic() just before the process was started
    ready_at: float  # time.monotonic() when /ready first answered 200
    log_path: Path  # the server's output


def _tenant_key(spec: ServerSpec, base: BaseModelSpec) -> str:
    registry = open_registry(RegistryConfig(spec.data_dir), base=base)
    try:
        registry.create_tenant(TENANT, _ACTOR)
        return registry.create_key(TENANT, _ACTOR).token
    finally:
        registry.close()


def _config_text(spec: ServerSpec, port: int) -> str:
    # NOTE: serve reads a file's paths relative to the file, which lies in data_dir: a relative
    # data_dir (qualify's default --report-dir) put both under themselves twice, so the server
    # found no model (separate) or a registry without the tenant's key (in-context: a 401).
    values: dict[str, object] = {
        "data_dir": str(spec.data_dir.resolve()),
        "host": "127.0.0.1",
        "port": port,
        "model": str(spec.model_dir.resolve()),
        "demo": False,
        "admin_key": "lpxadmin_" + secrets.token_urlsafe(24),
        "max_loras": 1,  # no adapter is served: the smallest slot pool there is
        "max_lora_rank": 8,
        "auto_warm": False,
        "max_model_len": spec.max_model_len,
        "max_num_seqs": spec.max_num_seqs,
        "torch_threads": spec.torch_threads,
    }
    lines = ["[serve]"] + [f"{file_key(k)} = {_toml(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@contextmanager
def comparator_server(spec: ServerSpec) -> Iterator[Running]:
    """Runs ``loraplex serve`` on ``spec.model_dir`` until the block ends."""
    base = BaseModelSpec.from_dir(spec.model_dir)
    spec.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = _tenant_key(spec, base)
    port = free_port()
    config = spec.data_dir / "serve.toml"
    config.write_text(_config_text(spec, port), encoding="utf-8")
    launch = Launch(
        name="loraplex serve (qualify comparator)",
        command=serve_command("--config", str(config)),
        env=own_env(OMP_NUM_THREADS=str(spec.torch_threads)),
        url=f"http://127.0.0.1:{port}",
        ready_path="/ready",
        log_path=spec.data_dir / "server.log",
        start_timeout_s=spec.start_timeout_s,
        stop_grace_s=20.0,
    )
    launched_at = time.monotonic()
    with serving_process(launch) as process:
        ready_at = time.monotonic()
        yield Running(
            launch.url, process.pid, key, base.name, launched_at, ready_at, launch.log_path
        )


class ServerPool:
    """Comparator servers kept running across the cells of one run, one per configuration
    (``ServerSpec`` less its data directory): a later cell that needs the same model with the
    same limits reuses the server instead of paying another model load. ``close`` stops them."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._running: dict[ServerSpec, Running] = {}
        self.started = 0  # servers started (a reuse starts none)

    def get(self, spec: ServerSpec) -> Running:
        """The running server of ``spec``'s configuration, started (in ``spec.data_dir``) when
        there is none yet."""
        key = replace(spec, data_dir=Path())
        if key not in self._running:
            self._running[key] = self._stack.enter_context(comparator_server(spec))
            self.started += 1
        return self._running[key]

    def close(self) -> None:
        self._running.clear()
        self._stack.close()


@contextmanager
def pooled_server(pool: ServerPool | None, spec: ServerSpec) -> Iterator[Running]:
    """``spec``'s server from ``pool`` (left running), or one of its own for the block."""
    if pool is None:
        with comparator_server(spec) as server:
            yield server
    else:
        yield pool.get(spec)


def peak_rss_bytes(pid: int) -> int:
    """Peak resident memory (``VmHWM``) of ``pid`` and its live descendants, summed: what one
    replica needs at the most (the engine child holds the model)."""
    total = 0
    for process in (pid, *descendants_of(pid)):
        try:
            status = Path(f"/proc/{process}/status").read_text(encoding="ascii")
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                total += int(line.split()[1]) * 1024  # kB
    return total


def machine_memory_bytes() -> int:
    """Physical memory of this machine (the one the replica's footprint was measured on)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
