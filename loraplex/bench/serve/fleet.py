"""The server side of ``loraplex bench serve``: a registry with every trace adapter, and a real
``loraplex serve`` subprocess on 127.0.0.1 per run.

The registry (database + artifact store) is prepared once; every server run gets a fresh data
directory (empty disk cache, cold L1/L0) and reaches the shared registry through its config
file, so runs start from the same state without copying artifacts.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.bench.harness.process import Launch, free_port, own_env, serve_command
from loraplex.bench.harness.process import serving_process as harness_serving
from loraplex.bench.serve.driver import REVISION
from loraplex.bench.workloads import TraceAdapter
from loraplex.registry import (
    PriorityClass,
    RegistrationRequest,
    RegistryConfig,
    TenantQuotas,
    open_registry,
)
from loraplex.serve.config import file_key

ACTOR = "bench-serve"
# Tenants of the WORKLOADS.md scenarios that are not "normal" traffic.
PRIORITIES = {
    "prio": PriorityClass.HIGH,
    "batch": PriorityClass.BATCH,
    "storm": PriorityClass.BATCH,
}
# What an operator gives a tenant known to fire cold storms: GPU slots' worth of adapter bytes
# (a quarter of cold-storm's 16 slots) and one cold load at a time.
STORM_GPU_SLOTS = 4
STORM_COLD_LOADS = 1


@dataclass(frozen=True)
class Fleet:
    """A prepared registry every server run of one benchmark shares."""

    root: Path  # holds the registry database and the artifact store
    model_dir: Path  # the base model the adapters were written against
    keys: dict[str, str]  # tenant -> API key
    admin_key: str  # the admin credential every server run uses
    max_lora_rank: int  # largest rank registered (and served)

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.root / 'registry.sqlite3'}"

    @property
    def store(self) -> Path:
        return self.root / "artifacts"


def served_rank(adapter: TraceAdapter, max_lora_rank: int) -> int:
    """The trace's rank, capped at what the server accepts (WIDE ranks reach 128)."""
    return min(adapter.rank, max_lora_rank)


def prepare_fleet(
    root: Path, model_dir: Path, adapters: Sequence[TraceAdapter], max_lora_rank: int, seed: int
) -> Fleet:
    """Random PEFT adapters for every trace adapter, registered as ``tenant/name@r1``, plus one
    API key per tenant."""
    from loraplex.bench.adapters import write_random_adapter

    base = BaseModelSpec.from_dir(model_dir)
    fleet = Fleet(root, model_dir, {}, "lpxadmin_" + secrets.token_urlsafe(24), max_lora_rank)
    config = RegistryConfig(root, fleet.database_url, str(fleet.store), None, max_lora_rank)
    registry = open_registry(config, base=base)
    quotas = {"storm": storm_quotas(base, max_lora_rank)}
    try:
        for tenant in dict.fromkeys(a.tenant for a in adapters):
            priority = PRIORITIES.get(tenant, PriorityClass.NORMAL)
            registry.create_tenant(tenant, ACTOR, priority, quotas.get(tenant))
            fleet.keys[tenant] = registry.create_key(tenant, ACTOR).token
        staging = root / "staging"
        for index, adapter in enumerate(adapters):
            path = write_random_adapter(
                base,
                model_dir,
                staging / f"{index:05d}",
                rank=served_rank(adapter, max_lora_rank),
                target_modules=adapter.targets,
                seed=seed * 100_003 + index,
            )
            request = RegistrationRequest(path, adapter.tenant, adapter.name, REVISION)
            registry.register(request, ACTOR)
    finally:
        registry.close()
    return fleet


def storm_quotas(base: BaseModelSpec, max_lora_rank: int) -> TenantQuotas:
    """The storm tenant's quotas: STORM_GPU_SLOTS slots' bytes, STORM_COLD_LOADS loads."""
    import torch

    from loraplex.model.lora import LoraSlotPool

    pool = LoraSlotPool(base, 1, max_lora_rank, dtype=torch.float32, device=torch.device("cpu"))
    slot_bytes = pool.bytes_per_slot  # float32, the dtype the benchmark serves
    return TenantQuotas(max_gpu_bytes=STORM_GPU_SLOTS * slot_bytes, max_cold_loads=STORM_COLD_LOADS)


@dataclass(frozen=True)
class ServerOptions:
    """The ``loraplex serve`` settings one run uses."""

    policy: str  # eviction policy (a residency.policy name)
    max_loras: int  # GPU slots
    cpu_adapter_bytes: int  # L1 budget
    max_num_seqs: int = 32  # sequences decoding at once
    queue_deadline_s: float = 30.0  # queue residence before a 503
    torch_threads: int = 1  # OMP threads of the server process (stable on shared cores)
    # tokens in one step; None: loraplex's default (written only when set, so a run without
    # it keeps the server's own default)
    max_num_batched_tokens: int | None = None
    # the server's request log (``request_log_path``: a line per request with the engine's
    # timeline); None: off
    request_log_path: Path | None = None
    # the share of each cached tier a tenant may hold (``default_tenant_tier_share``); None:
    # loraplex's default (written only when set)
    default_tenant_tier_share: float | None = None
    # ``tier_share_by_priority``: the shares hold only against equal or lower priorities
    tier_share_by_priority: bool = False


def drop_page_cache(root: Path) -> bool:
    """Asks the kernel to forget the cached pages of every file under ``root`` (the artifact
    store), so each server run reads its L3 objects from disk, not from the page cache an
    earlier run warmed. Needs no privileges (``posix_fadvise(DONTNEED)`` on clean pages; the
    store is fsynced first). False where the platform lacks posix_fadvise."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return False
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages would stay cached
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def serve_values(
    fleet: Fleet, data_dir: Path, options: ServerOptions, port: int
) -> dict[str, object]:
    """The ``[serve]`` settings of one run (ServeConfig field names)."""
    values: dict[str, object] = {
        "data_dir": str(data_dir),
        "host": "127.0.0.1",
        "port": port,
        "model": str(fleet.model_dir),
        "demo": False,
        "admin_key": fleet.admin_key,
        "policy": options.policy,
        "max_loras": options.max_loras,
        "max_lora_rank": fleet.max_lora_rank,
        "cpu_adapter_bytes": options.cpu_adapter_bytes,
        "max_num_seqs": options.max_num_seqs,
        "queue_deadline_s": options.queue_deadline_s,
        "torch_threads": options.torch_threads,  # explicit: every side runs the same count
        "database_url": fleet.database_url,
        "store": str(fleet.store),
        "metrics_public": True,
    }
    if options.max_num_batched_tokens is not None:
        values["max_num_batched_tokens"] = options.max_num_batched_tokens
    if options.request_log_path is not None:
        values["request_log_path"] = str(options.request_log_path)
    if options.default_tenant_tier_share is not None:
        values["default_tenant_tier_share"] = options.default_tenant_tier_share
    if options.tier_share_by_priority:  # written only when set, as the share
        values["tier_share_by_priority"] = True
    return values


def _write_config(fleet: Fleet, data_dir: Path, options: ServerOptions, port: int) -> Path:
    values = serve_values(fleet, data_dir, options, port)
    lines = ["[serve]"] + [f"{file_key(k)} = {_toml(v)}" for k, v in values.items()]
    path = data_dir / "serve.toml"
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Served:
    """A running ``loraplex serve`` of one run."""

    url: str  # its base URL
    pid: int  # the server process (its engine is a child of it)


@contextmanager
def serving(
    fleet: Fleet, data_dir: Path, options: ServerOptions, start_timeout_s: float = 180.0
) -> Iterator[str]:
    """Runs ``loraplex serve`` until the block ends; yields its base URL once /ready answers."""
    with serving_process(fleet, data_dir, options, start_timeout_s) as served:
        yield served.url


@contextmanager
def serving_process(
    fleet: Fleet, data_dir: Path, options: ServerOptions, start_timeout_s: float = 180.0
) -> Iterator[Served]:
    """``serving``, yielding the server's process id too (attacks that signal its engine or
    measure its memory need it). The log stays at ``data_dir/server.log``."""
    port = free_port()
    config = _write_config(fleet, data_dir, options, port)
    launch = Launch(
        name="loraplex serve",
        command=serve_command("--config", str(config)),
        env=own_env(OMP_NUM_THREADS=str(options.torch_threads)),
        url=f"http://127.0.0.1:{port}",
        ready_path="/ready",
        log_path=data_dir / "server.log",
        start_timeout_s=start_timeout_s,
        stop_grace_s=20.0,
    )
    with harness_serving(launch) as process:
        yield Served(launch.url, process.pid)
