"""What the HTTP layer is built from: its frozen config and the services it talks to
(``CacheControl``, the cache's surface, is in ``server/cache_control.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loraplex.clock import MonotonicClock
from loraplex.engine.merge_holds import MergeHoldControl
from loraplex.engine.protocol import EngineClient
from loraplex.registry import Registry
from loraplex.release.traffic import ReleaseTraffic
from loraplex.router.fleet_state import FleetStateSource
from loraplex.server.adapter_labels import DEFAULT_MAX_NAMED
from loraplex.server.admin_key import MIN_ADMIN_KEY_CHARS, TENANT_TOKEN_PREFIX, AdminKey
from loraplex.server.cache_control import CacheControl
from loraplex.server.chat import ChatTemplate
from loraplex.server.history import HistoryConfig
from loraplex.server.metrics import ServerMetrics
from loraplex.server.metrics_admin_key import AdminKeyCollector
from loraplex.server.recent_requests import RecentRequests
from loraplex.server.request_log import RequestLog
from loraplex.server.stream_buffer import DEFAULT_MAX_STREAM_RESUMES
from loraplex.server.tenant_jobs import MAX_LARGE_BODIES_PER_TENANT, TenantJobs
from loraplex.server.traffic_tally import TrafficTally
from loraplex.tracing.record import RequestTracing


def untracked_releases() -> ReleaseTraffic:
    """Release traffic that tracks nothing until told (``set_tracked``): for a server built
    without a release controller (tests, the bench); ``serve`` passes one fed by the registry."""
    return ReleaseTraffic(MonotonicClock(), tuple)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP layer's own settings."""

    base_model_name: str  # model id of the base model (``parent`` of every adapter in /v1/models)
    admin_key: str  # the administrative credential (Bearer token on /admin), as started
    # the file ``admin_key`` was read from, re-read when it changes (server/admin_key.py);
    # None: ``admin_key`` is fixed (given by --admin-key / LORAPLEX_ADMIN_KEY, or a test's)
    admin_key_file: Path | None = None
    import_dir: Path | None = None  # admin registration by server path stays inside it; None: off
    max_upload_bytes: int = 1 << 30  # largest adapter upload accepted by the admin API
    max_body_bytes: int = 8 << 20  # largest request body on every other route (413 beyond)
    max_prompt_chars: int = 256 << 10  # longest prompt text, checked before tokenizing (400)
    body_read_timeout_s: float = 30.0  # a request body must arrive within this (408 after)
    upload_read_timeout_s: float = 600.0  # ... and an adapter upload within this
    # a stream's events its client has not taken yet, at most (beyond: aborted, stream_buffer.py)
    max_stream_buffer_bytes: int = 256 << 10
    # from this many untaken bytes a stream's engine request is paused until its client reads
    # (stream_buffer.py); at or above max_stream_buffer_bytes it never is
    stream_pause_bytes: int = 64 << 10
    # times a paused stream may be resumed; once more and it ends (stream_buffer.py)
    max_stream_resumes: int = DEFAULT_MAX_STREAM_RESUMES
    queue_deadline_s: float | None = None  # max seconds a request may queue; None: engine default
    max_prompt_tokens: int | None = None  # longer prompts get a 400; None: no check here
    vocab_size: int | None = None  # token ids in a prompt must be below it; None: no check
    max_model_len: int | None = None  # the engine's context length (prompt + output); None: unknown
    # adapters named in /metrics labels at a time (the rest as __other__: server/adapter_labels.py)
    max_adapter_labels: int = DEFAULT_MAX_NAMED
    # /metrics without credentials. NOTE: it names adapters (tenant/name), so only enable it where
    # tenants cannot reach the port; otherwise scrapers send the admin key.
    metrics_public: bool = False
    # Redis holding the tenants' rate buckets for every ingress process (redis:// or rediss://;
    # not in repr: it may hold a password; ``quota/shared_ratelimit.py``); None: buckets per
    # process (``quota/ratelimit.py``)
    shared_state_url: str | None = field(default=None, repr=False)
    shared_state_prefix: str = "loraplex"  # key prefix there: one per deployment sharing it
    # one JSONL line per finished request, in the simulator's trace format (request_log.py);
    # None: off
    request_log_path: Path | None = None
    # bytes of one GPU slot (a max-rank adapter on every target module: every adapter's GPU copy
    # takes a whole one); a tenant's ``max_gpu_bytes`` below it is refused by the admin API, as
    # no adapter could ever load under it; None: not known here, not checked
    gpu_slot_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.base_model_name:
            raise ValueError("base_model_name '' is invalid; expected a non-empty name")
        if len(self.admin_key) < MIN_ADMIN_KEY_CHARS:
            raise ValueError(
                f"admin_key of {len(self.admin_key)} characters is invalid; expected at least "
                f"{MIN_ADMIN_KEY_CHARS}"
            )
        if self.admin_key.startswith(TENANT_TOKEN_PREFIX):
            raise ValueError(
                f"admin_key starting with {TENANT_TOKEN_PREFIX!r} is invalid; expected a "
                "credential distinct from tenant API keys"
            )
        for name in (
            "max_upload_bytes",
            "max_body_bytes",
            "max_prompt_chars",
            "max_stream_buffer_bytes",
            "stream_pause_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.max_stream_resumes < 0:
            raise ValueError(
                f"max_stream_resumes {self.max_stream_resumes} is invalid; expected >= 0"
            )
        for name in ("body_read_timeout_s", "upload_read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        if self.queue_deadline_s is not None and not self.queue_deadline_s > 0:
            raise ValueError(
                f"queue_deadline_s {self.queue_deadline_s} is invalid; expected > 0 or None"
            )
        if self.max_adapter_labels < 0:
            raise ValueError(
                f"max_adapter_labels {self.max_adapter_labels} is invalid; expected >= 0"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(
                f"max_model_len {self.max_model_len} is invalid; expected >= 1 or None"
            )
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(
                f"max_prompt_tokens {self.max_prompt_tokens} is invalid; expected >= 1 or None"
            )
        from loraplex.quota.shared_ratelimit import check_shared_state

        check_shared_state(self.shared_state_url, self.shared_state_prefix)


@dataclass(frozen=True)
class ServerDeps:
    """Everything ``create_app`` wires together (built by ``serve/front.py`` or a test)."""

    config: ServerConfig  # the HTTP layer's settings
    engine: EngineClient  # generation (the real AsyncEngine or a test fake)
    registry: Registry  # tenants, keys, adapters and alias resolution
    cache: CacheControl | None = None  # residency admin and cache metrics; None: absent
    chat: ChatTemplate | None = None  # chat template; None: /v1/chat/completions answers 400
    # Hands the registry's tenant settings to the engine and its cache after the admin API
    # changed a tenant. Required: a server that forgot it would keep enforcing stale quotas.
    refresh_tenants: Callable[[], None] = field(kw_only=True)
    # The windows the release controller compares; its clock also stamps ``recent``.
    releases: ReleaseTraffic = field(default_factory=untracked_releases, kw_only=True)
    # What /admin/fleet and its history show (``serve/front.py`` passes the fleet's ingress or
    # this server alone, ``serve/local_fleet.py``); None: those routes answer 503 ``no_fleet``.
    fleet: FleetStateSource | None = field(default=None, kw_only=True)
    # How much of the fleet's views and traffic the live page's history keeps (server/history.py).
    history: HistoryConfig = field(default_factory=HistoryConfig, kw_only=True)
    # Request traces (``loraplex.tracing``); None: tracing off.
    tracing: RequestTracing | None = field(default=None, kw_only=True)
    # Holds the admin guard takes on the engine side before it changes a revision's state
    # (server/merge_guard.py); None: the published report alone (an engine that never merges).
    merge_holds: MergeHoldControl | None = field(default=None, kw_only=True)
    # Unix seconds when this server was built: the base model's ``created`` in /v1/models (OpenAI
    # gives a model's creation time there and vLLM the time of the listing; 0 read as 1970).
    started_at_s: int = field(default_factory=lambda: int(time.time()), kw_only=True)
    # Each tenant's share of the thread pool for its tokenizing and formatting (tenant_jobs.py).
    jobs: TenantJobs = field(default_factory=TenantJobs, kw_only=True)
    # Each tenant's bodies parsed and validated off the event loop at once, each in one of its
    # ``jobs`` places too (json_route.py).
    large_bodies: TenantJobs = field(
        default_factory=lambda: TenantJobs(MAX_LARGE_BODIES_PER_TENANT), kw_only=True
    )
    # The server's metrics registry, built from ``engine`` and ``cache`` (never passed in).
    metrics: ServerMetrics = field(init=False, repr=False, compare=False)
    # The admin key in force (``config.admin_key``, re-read from ``config.admin_key_file``).
    admin: AdminKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # NOTE: frozen, so the derived field is set the one way a frozen dataclass allows.
        recent = RecentRequests(self.releases.clock)
        metrics = ServerMetrics(
            self.engine,
            self.cache,
            releases=self.releases,
            recent=recent,
            model_name=self.config.base_model_name,
            max_adapter_labels=self.config.max_adapter_labels,
            traffic=TrafficTally(self.history.max_tracked_revisions, self.history.top_revisions),
            request_log=(
                None
                if self.config.request_log_path is None
                else RequestLog(self.config.request_log_path)
            ),
            tracing=self.tracing,
        )
        object.__setattr__(self, "metrics", metrics)
        admin = AdminKey(self.config.admin_key, self.config.admin_key_file, self.releases.clock)
        object.__setattr__(self, "admin", admin)
        metrics.registry.register(AdminKeyCollector(admin))
