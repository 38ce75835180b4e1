"""The checks of ``ServeConfig``'s values, each a ValueError naming the key, the value and the
constraint (``record.py`` runs them in order in ``ServeConfig.__post_init__``); and the machine's
memory, which ``ServeConfig.check_kv_memory`` is given."""

from __future__ import annotations

from collections.abc import Mapping

from loraplex.engine.watchdog import DEFAULT_KILL_AFTER_S, DEFAULT_UNRESPONSIVE_AFTER_S
from loraplex.residency.policy import policy_names
from loraplex.serve.config.keys import file_key
from loraplex.server.stream_buffer import MIN_PAUSE_ROOM_BYTES

_POSITIVE = (
    "max_loras",
    "max_lora_rank",
    "max_num_seqs",
    "max_model_len",
    "num_kv_blocks",
    "block_size",
    "max_queue_len",
    "max_concurrent_loads",
    "tenant_max_concurrent_loads",
    "max_upload_bytes",
    "keep_alive_timeout_s",
    "max_connections",
    "max_header_bytes",
    "max_connections_per_address",
    "accepts_per_s_per_address",
    "max_stream_buffer_bytes",
    "stream_pause_bytes",
    "send_buffer_bytes",
    "max_header_count",
    "max_unsent_response_bytes",
)
_POSITIVE_OR_UNSET = (
    "max_cpu_loras",
    "gpu_adapter_bytes",
    "cpu_adapter_bytes",
    "torch_threads",
    "max_prompt_chars",
    "max_body_bytes",
    "max_unauthenticated_connections",
)
_NON_NEGATIVE = (
    "max_adapter_labels",
    "disk_cache_bytes",
    "max_stream_resumes",
    "min_send_bytes_per_s",
)
_POSITIVE_SECONDS = (
    "queue_deadline_s",
    "auto_warm_interval_s",
    "body_read_timeout_s",
    "upload_read_timeout_s",
    "header_read_timeout_s",
    "engine_hung_after_s",
    "engine_hung_kill_after_s",
    "engine_unresponsive_after_s",
    "write_timeout_s",
)


def check_listeners(host: str, port: int, admin_host: str | None, admin_port: int | None) -> None:
    for name, value in (("port", port), ("admin_port", admin_port)):
        if value is not None and not 0 <= value <= 65535:
            raise ValueError(f"{name} {value} is invalid; expected 0-65535")
    if admin_port and admin_port == port and admin_host in (None, host):
        raise ValueError(
            f"admin_port {admin_port} is invalid; expected another port than port {port}"
        )
    if admin_host is not None and admin_port is None:
        raise ValueError("admin_host is set without admin_port; expected both or neither")


def check_policy(policy: str) -> None:
    if policy not in policy_names():
        raise ValueError(f"policy {policy!r} is invalid; expected one of {list(policy_names())}")


def check_ranges(config: object) -> None:
    """The counts that must be positive (set, or unset where None means a default) and the
    seconds that must be above 0."""
    for name in _POSITIVE:
        if getattr(config, name) < 1:
            raise ValueError(f"{name} {getattr(config, name)} is invalid; expected >= 1")
    for name in _POSITIVE_OR_UNSET:
        value = getattr(config, name)
        if value is not None and value < 1:  # named as set (torch_threads: threads)
            raise ValueError(f"{file_key(name)} {value} is invalid; expected >= 1 or unset")
    for name in _POSITIVE_SECONDS:
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} {getattr(config, name)} is invalid; expected > 0")


def check_non_negative(config: object) -> None:
    for name in _NON_NEGATIVE:
        if getattr(config, name) < 0:
            raise ValueError(f"{name} {getattr(config, name)} is invalid; expected >= 0")


def check_connection_caps(
    max_connections: int, unauthenticated: int | None, tenant_share: float, ipv6_prefix: int
) -> None:
    if unauthenticated is not None and unauthenticated > max_connections:
        raise ValueError(
            f"max_unauthenticated_connections {unauthenticated} is invalid; expected <= "
            f"max_connections {max_connections} or unset"
        )
    if not 0 < tenant_share <= 1:
        raise ValueError(
            f"max_tenant_connection_share {tenant_share} is invalid; expected above 0, at most 1"
        )
    if not 1 <= ipv6_prefix <= 128:
        raise ValueError(f"ipv6_address_prefix {ipv6_prefix} is invalid; expected 1 to 128")


def check_engine_watch(engine_process: bool, kill_after_s: float, unresponsive: float) -> None:
    """An engine thread can be neither killed nor watched for liveness: those stay unset."""
    if not engine_process and kill_after_s != DEFAULT_KILL_AFTER_S:
        raise ValueError(
            f"engine_hung_kill_after_s {kill_after_s} is invalid with "
            "engine_process false; expected unset (an engine thread cannot be killed)"
        )
    if not engine_process and unresponsive != DEFAULT_UNRESPONSIVE_AFTER_S:
        raise ValueError(
            f"engine_unresponsive_after_s {unresponsive} is invalid with engine_process "
            "false; expected unset (an engine thread has no liveness signal of its own)"
        )


def check_auto_gpu_slots(auto_gpu: int | None, max_loras: int) -> None:
    if auto_gpu is not None and not 0 <= auto_gpu < max_loras:
        raise ValueError(
            f"max_auto_gpu_slots {auto_gpu} is invalid; expected 0 to max_loras - 1 "
            f"({max_loras - 1}: one slot stays free for demand loads) or unset"
        )


def check_cpu_loras(max_cpu_loras: int | None, max_loras: int) -> None:
    """vLLM's rule (``max_cpu_loras must be >= max_loras``): a host tier of fewer max-rank
    adapters than GPU slots was taken here, where vLLM refuses the same command line."""
    if max_cpu_loras is not None and max_cpu_loras < max_loras:
        raise ValueError(
            f"max_cpu_loras {max_cpu_loras} is invalid with max_loras {max_loras}; expected "
            f">= max_loras ({max_loras}), as vLLM requires, or unset (cpu_adapter_bytes sizes "
            "the CPU tier in bytes)"
        )


def check_step_limits(
    step_work_ratio: float, paused_kv_fraction: float, tokens: int | None, max_num_seqs: int
) -> None:
    if not step_work_ratio >= 0:
        raise ValueError(f"step_work_ratio {step_work_ratio} is invalid; expected >= 0")
    if not 0 <= paused_kv_fraction <= 1:
        raise ValueError(f"max_paused_kv_fraction {paused_kv_fraction} is invalid; expected 0 to 1")
    if tokens is not None and tokens < max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens {tokens} is invalid; expected >= max_num_seqs "
            f"{max_num_seqs} (every running sequence decodes each step) or unset"
        )


# What a stream's pause does: read only where a stream can be paused (``stream_pause_bytes`` below
# ``max_stream_buffer_bytes``; at or above it the overflow abort comes first, stream_buffer.py).
PAUSE_KEYS = ("max_stream_resumes", "max_paused_kv_fraction")


def check_stream_pause_room(pause_bytes: int, buffer_bytes: int) -> None:
    """Where streams pause (``pause_bytes`` < ``buffer_bytes``), what arrives after a pause
    must fit below ``buffer_bytes`` (``stream_buffer.MIN_PAUSE_ROOM_BYTES``), else a client
    that merely fell behind is cut with ``stream_not_read``."""
    room = buffer_bytes - pause_bytes
    if 0 < room < MIN_PAUSE_ROOM_BYTES:
        raise ValueError(
            f"stream_pause_bytes {pause_bytes} leaves {room} bytes below "
            f"max_stream_buffer_bytes {buffer_bytes}; expected at least {MIN_PAUSE_ROOM_BYTES} "
            "(what a stream receives after its pause: measured up to 33.2 KB), or "
            "stream_pause_bytes >= max_stream_buffer_bytes (never paused)"
        )


def check_stream_pause_keys(
    pause_bytes: int, buffer_bytes: int, config: object, defaults: Mapping[str, object]
) -> None:
    """A pause setting (``PAUSE_KEYS``) of ``config`` set while no stream is ever paused
    (``pause_bytes`` >= ``buffer_bytes``) is refused naming it (it was taken and did nothing)."""
    if pause_bytes < buffer_bytes:
        return
    for key in PAUSE_KEYS:
        value = getattr(config, key)
        if value != defaults[key]:
            raise ValueError(
                f"{key} {value} is set while stream_pause_bytes {pause_bytes} >= "
                f"max_stream_buffer_bytes {buffer_bytes} (no stream is ever paused); expected "
                f"stream_pause_bytes below max_stream_buffer_bytes, or {key} left out"
            )
