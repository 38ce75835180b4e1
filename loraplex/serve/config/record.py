"""``loraplex serve``'s configuration record (``ServeConfig``): its fields (the TOML keys), the
order of its checks (``checks.py``) and the budgets derived from it.

Torch-free. Byte budgets are what the cache enforces; vLLM's count flags are translated into
them with the bytes of one *slot*: an adapter of rank ``max_lora_rank`` on every target module of
every layer (``artifacts.base_model.lora_bytes``):

- ``max_loras``: GPU slots; ``gpu_adapter_bytes`` (if set) lowers it to the slots that fit;
- ``cpu_adapter_bytes``: the L1 budget; when unset, ``max_cpu_loras`` slots' worth (vLLM's
  ``--max-cpu-loras``), else 1 GiB;
- ``disk_cache_bytes``: the L2 (local disk) budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec, lora_bytes
from loraplex.devices import check_device
from loraplex.dtypes import DEFAULT_DTYPE, bytes_per_element, check_dtype
from loraplex.engine.config import check_base_linear_kernel, check_finite
from loraplex.engine.kv.blocks import kv_cache_bytes
from loraplex.engine.mode_policy import (
    MERGE_STEP_BUDGET_S,
    ModeSetting,
    check_merge_step_budget,
)
from loraplex.engine.watchdog import (
    DEFAULT_HUNG_AFTER_S,
    DEFAULT_KILL_AFTER_S,
    DEFAULT_UNRESPONSIVE_AFTER_S,
)
from loraplex.model.config import check_max_model_len
from loraplex.quota.shared_ratelimit import (
    DEFAULT_KEY_PREFIX,
    check_shared_state,
)
from loraplex.registry.sql.timeouts import database_pool_size, database_timeouts
from loraplex.residency.ledger import check_tier_share
from loraplex.residency.policy import DEFAULT_POLICY
from loraplex.residency.warm import (
    DEFAULT_AUTO_WARM_INTERVAL_S,
    check_auto_warm_settings,
    default_auto_gpu_slots,
)
from loraplex.serve.config.checks import (
    check_auto_gpu_slots,
    check_connection_caps,
    check_cpu_loras,
    check_engine_watch,
    check_listeners,
    check_non_negative,
    check_policy,
    check_ranges,
    check_step_limits,
    check_stream_pause_keys,
    check_stream_pause_room,
)
from loraplex.serve.config.keys import file_key
from loraplex.serve.logs import DEFAULT_LOG_LEVEL, check_log_level
from loraplex.server.adapter_labels import DEFAULT_MAX_NAMED
from loraplex.server.batch_limit import MAX_BATCH_PROMPTS
from loraplex.server.request_log import check_log_path
from loraplex.server.stream_buffer import DEFAULT_MAX_STREAM_RESUMES
from loraplex.tracing.config import check_trace_settings

DEFAULT_CPU_ADAPTER_BYTES = 1 << 30
PROMPT_CHARS_PER_TOKEN = 64  # the default prompt character cap per token of max_model_len
# The default body cap: every prompt of a full batch at its character cap, at UTF-8's widest
# character, plus this much for every other field (each bounded on its own by the schema).
BODY_BYTES_PER_PROMPT_CHAR = 4
BODY_FIELDS_BYTES = 1 << 20
# The default step token budget is at least this (and at least max_num_seqs, one decode each).
MIN_DEFAULT_BATCHED_TOKENS = 512


# Keys only the tracer reads: set (to anything but their default) without ``trace_endpoint``,
# nothing would read them.
_TRACER_KEYS = ("trace_sample_ratio", "trace_slow_s", "trace_export_names")

# A tenant's share of each tier (its slots and bytes): kept against other tenants, not a cap.
DEFAULT_TENANT_TIER_SHARE = 0.5


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
    policy: str = DEFAULT_POLICY  # eviction policy: a name of residency.policy's registry
    mode: str = "unmerged"  # unmerged | merged:<tenant/name@revision> | auto (docs/modes.md)
    # seconds of merge staging one step boundary runs at most (engine.mode_policy); not unmerged
    merge_step_budget_s: float = MERGE_STEP_BUDGET_S
    # adapter loads in flight (all tenants), and per tenant (the cold-load quota's default)
    max_concurrent_loads: int = 4
    tenant_max_concurrent_loads: int = 2
    # promote/demote revisions between warm policies from their request rates (residency.warm)
    auto_warm: bool = True
    # seconds between two automatic warm rebalances
    auto_warm_interval_s: float = DEFAULT_AUTO_WARM_INTERVAL_S
    # GPU slots automatic ``gpu`` promotion may pin (the rest stay free for demand loads); None:
    # a quarter of the GPU slots, rounded down
    max_auto_gpu_slots: int | None = None
    # the fraction of each cached tier (GPU slots, host memory, disk) every tenant keeps against
    # the others: work-conserving (free room beyond it is borrowed; borrowed copies go first
    # when another tenant needs room); a byte cap of a tenant's own stays hard; 1.0: no share
    default_tenant_tier_share: float = DEFAULT_TENANT_TIER_SHARE
    # the tier shares hold only against tenants of the same or lower priority class: a lower-
    # priority tenant's load takes a higher one's borrowed room only in the eviction policy's
    # order and holds up none of its leases (``residency/cache/config.py``); False: against all
    tier_share_by_priority: bool = False
    device: str = "cpu"  # torch device of the model and the slots
    dtype: str = DEFAULT_DTYPE  # model / adapter dtype (loraplex.dtypes)
    # the base linears' matmul (engine/config.BASE_LINEAR_KERNELS): "auto" packs a second copy
    # of the float32 weights on a CPU (faster decode, the weights' bytes again); "onednn" or
    # "blas" keep one copy
    base_linear_kernel: str = "auto"
    max_num_seqs: int = 32  # sequences decoding at once
    # tokens in one forward (decodes + prefill chunks); None: max(512, max_num_seqs)
    max_num_batched_tokens: int | None = None
    max_model_len: int = 512  # prompt + output tokens of one sequence
    num_kv_blocks: int = 1024  # paged KV cache size in blocks
    block_size: int = 16  # tokens per KV block
    queue_deadline_s: float = 30.0  # longest queue residence before a 503
    max_queue_len: int = 1024  # queued requests before a 429
    # sequences kept free for a higher priority class while one is active (None: a quarter of
    # max_num_seqs; 0: lower classes may fill every seat)
    class_reserve_seqs: int | None = None
    # the busiest tenant's work in one step at most this many times the next busiest tenant's
    # (engine/sched/step_share.py); 0: off, every running sequence decodes every step
    step_work_ratio: float = 1.0
    # fraction of the KV cache in which paused requests (their clients stopped reading) keep
    # their blocks, so that a resume recomputes nothing (engine/sched/kept_kv.py); 0: a pause
    # frees them
    max_paused_kv_fraction: float = 0.25
    database_url: str | None = None  # registry database; None: SQLite in data_dir
    store: str | None = None  # artifact store directory or s3://bucket/prefix
    s3_endpoint: str | None = None  # S3-compatible endpoint
    # limits on waits for a PostgreSQL registry (registry/sql/timeouts.py); None: the default
    # (5 s, 10 s, 5 s but at most the statement timeout); refused with a SQLite registry
    database_connect_timeout_s: float | None = None  # a new connection, login included
    database_statement_timeout_s: float | None = None  # one statement, lock waits included
    database_lock_timeout_s: float | None = None  # one wait for a row/advisory lock
    # connections to a PostgreSQL registry one process opens at most (None: 4); refused with
    # a SQLite registry
    database_pool_size: int | None = None
    # Redis shared by every ingress process for the tenants' rate buckets (redis:// or
    # rediss://; not in repr: it may hold a password); None: buckets per process
    shared_state_url: str | None = field(default=None, repr=False)
    shared_state_prefix: str = DEFAULT_KEY_PREFIX  # its key prefix: one per deployment
    metrics_public: bool = False  # /metrics without the admin credential
    # uvicorn's access log: one stdout line per HTTP request (client address, method, path,
    # status); false: none, as uvicorn's --no-access-log (errors are still logged)
    access_log: bool = True
    # loraplex's own lines (stderr: time, level, logger name) and uvicorn's, at this level and
    # above: one of serve.logs.LOG_LEVELS
    log_level: str = DEFAULT_LOG_LEVEL
    # adapters named in /metrics labels at a time; the rest are counted as adapter="__other__"
    max_adapter_labels: int = DEFAULT_MAX_NAMED
    # run the engine in its own process (HTTP and model execution then do not share one
    # interpreter lock); false: on a thread of the server process
    engine_process: bool = True
    # an engine with work pending and no step progress this long is hung (not ready, new
    # requests 503); hung this much longer, its process is killed and restarted
    engine_hung_after_s: float = DEFAULT_HUNG_AFTER_S
    engine_hung_kill_after_s: float = DEFAULT_KILL_AFTER_S  # only an engine process is killed
    # an engine process with work pending and no sign of life (its liveness thread beats every
    # fifth of this) this long is frozen (SIGSTOP, a stalled VM): hung at once, as above
    engine_unresponsive_after_s: float = DEFAULT_UNRESPONSIVE_AFTER_S
    # torch intra-op threads; None: one per core but one (left to the event loop), unless
    # OMP_NUM_THREADS is set (the CLI resolves it)
    torch_threads: int | None = None
    # --- bounded work per client (docs/operations.md, "Limits per client") ---
    # largest request body except an adapter upload (413); None: what a valid request can need
    # (``body_bytes``)
    max_body_bytes: int | None = None
    max_upload_bytes: int = 1 << 30  # largest adapter upload, config and weights together (413)
    # longest prompt text (chat: all messages), refused before tokenizing; None: 64 characters
    # per token of max_model_len
    max_prompt_chars: int | None = None
    body_read_timeout_s: float = 30.0  # a request body must arrive within this (408)
    upload_read_timeout_s: float = 600.0  # an adapter upload must arrive within this (408)
    header_read_timeout_s: float = 10.0  # a request head must arrive within this (closed)
    keep_alive_timeout_s: int = 5  # an idle keep-alive connection is closed after this
    # open connections; a new one beyond a cap below takes the place of the oldest idle
    # unauthenticated one, else is closed at once (server/connections.py)
    max_connections: int = 1024
    max_header_bytes: int = 16 << 10  # largest request head (400 and closed beyond it)
    # open with no request past a credential check; None: half of max_connections
    max_unauthenticated_connections: int | None = None
    max_connections_per_address: int = 512  # open from one client IP address
    accepts_per_s_per_address: int = 512  # new connections per second from one IP (closed beyond)
    # the fraction of max_connections a tenant may hold while newcomers are turned away; beyond
    # it its new connections are answered 429 and closed (server/connections.py)
    max_tenant_connection_share: float = 0.5
    # an IPv6 client is counted, for the two per-address bounds, as its network of this prefix
    # length (a /64 holds 2^64 addresses: counted per address, one client passes both bounds)
    ipv6_address_prefix: int = 64
    max_header_count: int = 100  # header lines of a request head (431 and closed beyond it)
    # a client taking less of its waiting answer than min_send_bytes_per_s x this is cut off
    write_timeout_s: float = 30.0
    min_send_bytes_per_s: int = 16 << 10  # 0: any byte taken in each write_timeout_s will do
    # answer bytes waiting for slow clients, all connections; beyond, the slowest are cut
    max_unsent_response_bytes: int = 256 << 20
    send_buffer_bytes: int = 256 << 10  # SO_SNDBUF per connection (the kernel's share of a reply)
    # a stream's events its client has not taken, at most; beyond, the request is aborted
    max_stream_buffer_bytes: int = 256 << 10
    # a stream's untaken events from which its engine request is paused (seat freed; its KV
    # kept within max_paused_kv_fraction) until its client reads again; at or above
    # max_stream_buffer_bytes: never paused
    stream_pause_bytes: int = 64 << 10
    # times a paused stream may be resumed after a stall (a resume whose KV was not kept
    # recomputes its prompt and output so far); a client that stalls once more is cut off
    max_stream_resumes: int = DEFAULT_MAX_STREAM_RESUMES
    # --- request traces (docs/observability.md, "Traces"; needs the ``otel`` extra) ---
    trace_endpoint: str | None = None  # OTLP/HTTP traces URL; None: tracing off
    trace_sample_ratio: float = 0.01  # fraction of requests traced (by trace id)
    trace_slow_s: float = 10.0  # requests this long are traced (within the slow share)
    trace_export_names: bool = False  # tenant/adapter names in spans; false: keyed hashes
    # one JSONL line per finished request in the simulator's trace format (docs/simulator.md);
    # None: off
    request_log_path: Path | None = None

    def __post_init__(self) -> None:
        # NOTE: the order decides which error a config with several wrong values gets.
        check_finite(self, file_key)  # NaN passes a negated comparison, inf every upper one
        check_listeners(self.host, self.port, self.admin_host, self.admin_port)
        check_log_level(self.log_level)
        check_trace_settings(self.trace_endpoint, self.trace_sample_ratio, self.trace_slow_s)
        ModeSetting.parse(self.mode)  # raises ValueError naming the mode
        check_merge_step_budget(self.merge_step_budget_s, self.mode)
        check_policy(self.policy)
        check_dtype(self.dtype)
        check_device(self.device)
        check_base_linear_kernel(self.base_linear_kernel, self.dtype, self.device)
        check_tier_share(self.default_tenant_tier_share)
        check_ranges(self)
        check_connection_caps(
            self.max_connections,
            self.max_unauthenticated_connections,
            self.max_tenant_connection_share,
            self.ipv6_address_prefix,
        )
        check_shared_state(self.shared_state_url, self.shared_state_prefix)
        database_timeouts(
            self.database_connect_timeout_s,
            self.database_statement_timeout_s,
            self.database_lock_timeout_s,
        )
        database_pool_size(self.database_pool_size)
        check_non_negative(self)
        check_engine_watch(
            self.engine_process, self.engine_hung_kill_after_s, self.engine_unresponsive_after_s
        )
        check_auto_gpu_slots(self.max_auto_gpu_slots, self.max_loras)
        check_cpu_loras(self.max_cpu_loras, self.max_loras)
        check_step_limits(
            self.step_work_ratio,
            self.max_paused_kv_fraction,
            self.max_num_batched_tokens,
            self.max_num_seqs,
        )
        check_stream_pause_room(self.stream_pause_bytes, self.max_stream_buffer_bytes)
        self._check_keys_read()

    def _check_keys_read(self) -> None:
        """ValueError naming a key set where nothing reads it: an automatic warm setting with
        ``auto_warm`` false, a ``trace_*`` setting without ``trace_endpoint``, a pause setting
        where no stream is paused (each was taken and did nothing), and ``max_cpu_loras``
        beside ``cpu_adapter_bytes`` (which won in silence)."""
        check_auto_warm_settings(self.auto_warm, self.auto_warm_interval_s, self.max_auto_gpu_slots)
        defaults = {f.name: f.default for f in fields(self)}
        for key in _TRACER_KEYS:
            value = getattr(self, key)
            if value != defaults[key] and self.trace_endpoint is None:
                shown = str(value).lower() if isinstance(value, bool) else value  # TOML's way
                raise ValueError(
                    f"{key} {shown} is set while trace_endpoint is unset; expected "
                    f"trace_endpoint set too, or {key} left out (only the tracer reads it)"
                )
        check_stream_pause_keys(
            self.stream_pause_bytes, self.max_stream_buffer_bytes, self, defaults
        )
        if self.max_cpu_loras is not None and self.cpu_adapter_bytes is not None:
            raise ValueError(
                f"max_cpu_loras {self.max_cpu_loras} is set beside cpu_adapter_bytes "
                f"{self.cpu_adapter_bytes}; expected one of them (max_cpu_loras sizes the CPU "
                "tier only when cpu_adapter_bytes is unset)"
            )

    def batched_tokens(self) -> int:
        """``max_num_batched_tokens``, or max(512, ``max_num_seqs``) when unset."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(MIN_DEFAULT_BATCHED_TOKENS, self.max_num_seqs)

    def prompt_chars(self) -> int:
        """``max_prompt_chars``, or 64 characters per token of ``max_model_len``: far above
        any tokenizer's average, far below the text that would stall a tokenizer for long."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return PROMPT_CHARS_PER_TOKEN * self.max_model_len

    def body_bytes(self) -> int:
        """``max_body_bytes``, or the largest body a valid request can need: a full batch of
        prompts (``MAX_BATCH_PROMPTS``) each at ``prompt_chars`` of 4-byte characters, plus
        1 MiB for every other field. A token-id prompt of ``max_model_len`` ids is far smaller
        than its text cap, so a body past this holds a prompt the server would refuse anyway,
        and is refused from its ``Content-Length`` before a byte of it is read or parsed."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        prompts = MAX_BATCH_PROMPTS * self.prompt_chars() * BODY_BYTES_PER_PROMPT_CHAR
        return prompts + BODY_FIELDS_BYTES

    def slot_bytes(self, base: BaseModelSpec) -> int:
        """Bytes of one max-rank adapter on every target module of every layer."""
        return lora_bytes(base, self.max_lora_rank, bytes_per_element(self.dtype))

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

    def auto_gpu_slots(self, base: BaseModelSpec) -> int:
        """``max_auto_gpu_slots``, or a quarter of ``gpu_slots`` when unset; always fewer than
        the GPU slots, so automatic pins never take every slot."""
        slots = self.gpu_slots(base)
        if self.max_auto_gpu_slots is None:
            return default_auto_gpu_slots(slots)
        if self.max_auto_gpu_slots >= slots:
            raise ValueError(
                f"max_auto_gpu_slots {self.max_auto_gpu_slots} is invalid; expected fewer than "
                f"the {slots} GPU slots gpu_adapter_bytes {self.gpu_adapter_bytes} leaves"
            )
        return self.max_auto_gpu_slots

    def kv_bytes(self, base: BaseModelSpec, rows: int | None = None) -> int:
        """Bytes of the paged KV cache of ``rows`` tokens (None: ``num_kv_blocks`` x
        ``block_size``, what the engine allocates)."""
        rows = self.num_kv_blocks * self.block_size if rows is None else rows
        element = bytes_per_element(self.dtype)
        return kv_cache_bytes(base.num_layers, base.num_kv_heads, base.head_dim, rows, element)

    def check_kv_memory(
        self, base: BaseModelSpec, memory_bytes: int | None, replicas: int = 1
    ) -> None:
        """ValueError naming ``num_kv_blocks`` and ``block_size`` when the KV caches of
        ``replicas`` engines on a ``cpu`` device (one for ``serve``; ``fleet up``'s local Ray
        head runs every replica on this machine) need more than ``memory_bytes`` (the
        machine's, ``memory_total_bytes``): they can never be allocated (the engine process
        failed with an out-of-memory error, after the server announced itself). A CUDA
        device's memory is not known here (no torch): the engine start refuses it, naming them
        too."""
        need = self.kv_bytes(base) * replicas
        if self.device != "cpu" or memory_bytes is None or need <= memory_bytes:
            return
        # rows=0: the padding row, one row
        rows = memory_bytes // replicas // self.kv_bytes(base, rows=0)
        blocks = f"num_kv_blocks {self.num_kv_blocks} x block_size {self.block_size}"
        if replicas == 1:
            raise ValueError(
                f"{blocks} is invalid; its KV cache needs {need} bytes, more than this "
                f"machine's {memory_bytes} bytes of memory (expected num_kv_blocks x "
                f"block_size below {rows} tokens)"
            )
        raise ValueError(
            f"{blocks} is invalid with {replicas} replicas on this machine; their KV caches "
            f"need {replicas} x {self.kv_bytes(base)} = {need} bytes, more than this "
            f"machine's {memory_bytes} bytes of memory (expected num_kv_blocks x block_size "
            f"below {rows} tokens per replica, or fewer replicas)"
        )

    def check_context(self, model_config: dict[str, object]) -> None:
        """ValueError naming ``max_model_len`` when it is above the context of the model whose
        ``config.json`` is ``model_config`` (``model.config.check_max_model_len``: its
        ``max_position_embeddings``, or what its rope scaling extends it to)."""
        check_max_model_len(self.max_model_len, model_config)

    def check_import_dir(self) -> None:
        """ValueError naming ``import_dir`` when it is set and not a directory: the server used
        to start and answer every registration by path with a 500."""
        if self.import_dir is not None and not self.import_dir.is_dir():
            raise ValueError(
                f"import_dir {self.import_dir} is invalid; expected a directory (it does not "
                "exist or is not a folder)"
            )

    def check_request_log_path(self) -> None:
        """ValueError naming ``request_log_path`` when its directory does not exist or the file
        cannot be appended to. The HTTP side's ``RequestLog`` refused it only
        once built, after a first start had issued the demo tenants' keys, never shown."""
        if self.request_log_path is not None:
            check_log_path(self.request_log_path)

    def cpu_bytes(self, base: BaseModelSpec) -> int:
        if self.cpu_adapter_bytes is not None:
            return self.cpu_adapter_bytes
        if self.max_cpu_loras is not None:
            return self.max_cpu_loras * self.slot_bytes(base)
        return DEFAULT_CPU_ADAPTER_BYTES
