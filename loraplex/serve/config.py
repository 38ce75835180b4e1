"""``loraplex serve``'s configuration: one frozen record, from a TOML file and/or flags.

Torch-free. Byte budgets are what the cache enforces; vLLM's count flags are translated into
them with the bytes of one *slot*: an adapter of rank ``max_lora_rank`` on every target module of
every layer, ``sum (d_in + d_out) * rank * bytes_per_param`` (DESIGN.md §2):

- ``max_loras``: GPU slots; ``gpu_adapter_bytes`` (if set) lowers it to the slots that fit;
- ``cpu_adapter_bytes``: the L1 budget; when unset, ``max_cpu_loras`` slots' worth (vLLM's
  ``--max-cpu-loras``), else 1 GiB;
- ``disk_cache_bytes``: the L2 (local disk) budget.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec

DEFAULT_CPU_ADAPTER_BYTES = 1 << 30
_PARAM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
POLICIES = ("cost_aware", "lru")
PROMPT_CHARS_PER_TOKEN = 64  # the default prompt character cap per token of max_model_len


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``loraplex serve`` needs. Field names are the TOML keys (``[serve]`` table)."""

    data_dir: Path  # registry database, artifact store, adapter disk cache, demo assets, secrets
    host: str = "127.0.0.1"  # listen address
    port: int = 8000  # listen port
    # a separate listener for /admin and /metrics (then only there); None: on the main port
    admin_port: int | None = None
    admin_host: str | None = None  # the admin listener's address; None: ``host``
    model: Path | None = None  # base model directory; None: the generated demo model
    demo: bool = True  # with the demo model: register demo tenants/adapters, print sample keys
    admin_key: str | None = None  # the admin credential; None: generated once, kept in data_dir
    import_dir: Path | None = None  # admin registration by server path stays inside it
    max_loras: int = 8  # GPU adapter slots (vLLM --max-loras)
    max_cpu_loras: int | None = None  # L1 size in max-rank adapters (vLLM --max-cpu-loras)
    max_lora_rank: int = 64  # largest adapter rank accepted and held (vLLM --max-lora-rank)
    gpu_adapter_bytes: int | None = None  # L0 byte budget (caps max_loras)
    cpu_adapter_bytes: int | None = None  # L1 byte budget
    disk_cache_bytes: int = 8 << 30  # L2 byte budget
    policy: str = "cost_aware"  # eviction policy: cost_aware or lru
    device: str = "cpu"  # torch device of the model and the slots
    dtype: str = "float32"  # model / adapter dtype
    max_num_seqs: int = 32  # sequences decoding at once
    max_model_len: int = 512  # prompt + output tokens of one sequence
    num_kv_blocks: int = 1024  # paged KV cache size in blocks
    block_size: int = 16  # tokens per KV block
    queue_deadline_s: float = 30.0  # longest queue residence before a 503
    max_queue_len: int = 1024  # queued requests before a 429
    # sequences kept free for a higher priority class while one is active (None: a quarter of
    # max_num_seqs; 0: lower classes may fill every seat)
    class_reserve_seqs: int | None = None
    database_url: str | None = None  # registry database; None: SQLite in data_dir
    store: str | None = None  # artifact store directory or s3://bucket/prefix
    s3_endpoint: str | None = None  # S3-compatible endpoint
    metrics_public: bool = False  # /metrics without the admin credential
    # run the engine in its own process (HTTP and model execution then do not share one
    # interpreter lock); false: on a thread of the server process
    engine_process: bool = True
    # torch intra-op threads; None: one per core but one (left to the event loop), unless
    # OMP_NUM_THREADS is set (the CLI resolves it)
    torch_threads: int | None = None
    # --- bounded work per client (docs/operations.md, "Limits per client") ---
    max_body_bytes: int = 8 << 20  # largest request body except an adapter upload (413)
    max_upload_bytes: int = 1 << 30  # largest adapter upload, config and weights together (413)
    # longest prompt text (chat: all messages), refused before tokenizing; None: 64 characters
    # per token of max_model_len
    max_prompt_chars: int | None = None
    body_read_timeout_s: float = 30.0  # a request body must arrive within this (408)
    upload_read_timeout_s: float = 600.0  # an adapter upload must arrive within this (408)
    header_read_timeout_s: float = 10.0  # a request head must arrive within this (closed)
    keep_alive_timeout_s: int = 5  # an idle keep-alive connection is closed after this
    max_connections: int = 1024  # open connections (503 at the cap, closed beyond it)
    max_header_bytes: int = 16 << 10  # largest request head (400 and closed beyond it)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is invalid; expected 0-65535")
        if self.admin_port is not None and not 0 <= self.admin_port <= 65535:
            raise ValueError(f"admin_port {self.admin_port} is invalid; expected 0-65535")
        if (
            self.admin_port
            and self.admin_port == self.port
            and self.admin_host in (None, self.host)
        ):
            raise ValueError(
                f"admin_port {self.admin_port} is invalid; expected another port than port "
                f"{self.port}"
            )
        if self.admin_host is not None and self.admin_port is None:
            raise ValueError("admin_host is set without admin_port; expected both or neither")
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is invalid; expected one of {POLICIES}")
        if self.dtype not in _PARAM_BYTES:
            raise ValueError(f"dtype {self.dtype!r} is invalid; expected {list(_PARAM_BYTES)}")
        positive = ("max_loras", "max_lora_rank", "max_num_seqs", "max_model_len",
                    "num_kv_blocks", "block_size", "max_queue_len", "max_body_bytes",
                    "max_upload_bytes", "keep_alive_timeout_s", "max_connections",
                    "max_header_bytes")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        for name in ("body_read_timeout_s", "upload_read_timeout_s", "header_read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        optional = ("max_cpu_loras", "gpu_adapter_bytes", "cpu_adapter_bytes", "torch_threads",
                    "max_prompt_chars")  # fmt: skip
        for name in optional:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} {value} is invalid; expected >= 1 or unset")
        if self.disk_cache_bytes < 0:
            raise ValueError(f"disk_cache_bytes {self.disk_cache_bytes} is invalid; expected >= 0")
        if not self.queue_deadline_s > 0:
            raise ValueError(f"queue_deadline_s {self.queue_deadline_s} is invalid; expected > 0")

    def prompt_chars(self) -> int:
        """``max_prompt_chars``, or 64 characters per token of ``max_model_len``: far above
        any tokenizer's average, far below the text that would stall a tokenizer for long."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return PROMPT_CHARS_PER_TOKEN * self.max_model_len

    def slot_bytes(self, base: BaseModelSpec) -> int:
        """Bytes of one max-rank adapter on every target module of every layer."""
        widths = sum(sum(base.module_shape(m)) for m in TARGET_MODULES) * base.num_layers
        return widths * self.max_lora_rank * _PARAM_BYTES[self.dtype]

    def gpu_slots(self, base: BaseModelSpec) -> int:
        """``max_loras``, lowered to what ``gpu_adapter_bytes`` holds."""
        if self.gpu_adapter_bytes is None:
            return self.max_loras
        fitting = self.gpu_adapter_bytes // self.slot_bytes(base)
        if fitting < 1:
            raise ValueError(
                f"gpu_adapter_bytes {self.gpu_adapter_bytes} is invalid; expected at least one "
                f"slot of {self.slot_bytes(base)} bytes (rank {self.max_lora_rank})"
            )
        return min(self.max_loras, fitting)

    def cpu_bytes(self, base: BaseModelSpec) -> int:
        if self.cpu_adapter_bytes is not None:
            return self.cpu_adapter_bytes
        if self.max_cpu_loras is not None:
            return self.max_cpu_loras * self.slot_bytes(base)
        return DEFAULT_CPU_ADAPTER_BYTES


_PATH_FIELDS = {"data_dir", "model", "import_dir"}


def read_config_file(path: Path) -> dict[str, Any]:
    """The ``[serve]`` table of a TOML file (or its top level when there is no such table)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config file {path}: {exc}") from exc
    table = document.get("serve", document)
    if not isinstance(table, dict):
        raise ValueError(f"config file {path}: [serve] is invalid; expected a table")
    known = {f.name for f in fields(ServeConfig)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"config file {path}: unknown keys {unknown}; expected {sorted(known)}")
    base = path.parent
    return {
        k: (base / v if k in _PATH_FIELDS and isinstance(v, str) else v) for k, v in table.items()
    }


def merge(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> ServeConfig:
    """Flags given on the command line (not None) override the file; the file the defaults."""
    values = dict(file_values)
    values.update({k: v for k, v in flags.items() if v is not None})
    for name in _PATH_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = Path(values[name])
    return ServeConfig(**values)
