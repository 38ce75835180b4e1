"""Typed records of the control plane: what the registry stores and hands out.

Every record is frozen: a change is a new row (or a new record read back), never a mutation, so a
record handed to the server or the cache can never drift from what the database says it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from loraplex.artifacts.identity import AdapterKey, check_name
from loraplex.artifacts.warm_policy import WarmPolicy


class PriorityClass(StrEnum):
    """Which tenant yields first when tenants compete for residency and admission."""

    HIGH = "high"  # interactive traffic, protected from other tenants' bursts
    NORMAL = "normal"  # the default
    BATCH = "batch"  # throughput traffic, the first to give way


class RevisionState(StrEnum):
    """Where a revision is in the release flow (canary -> stable -> deprecated)."""

    CANARY = "canary"  # receives only the canary share of an alias
    STABLE = "stable"  # serves an alias's main share
    DEPRECATED = "deprecated"  # never chosen through an alias; still resolvable when pinned


class Visibility(StrEnum):
    """Who may use an adapter. Private adapters are invisible to other tenants."""

    PRIVATE = "private"  # the owning tenant only (the default)
    PUBLIC = "public"  # explicitly shared with every tenant


MAX_SEAT_LIMIT = 1 << 31  # largest seat or KV-block limit stored (fits every BIGINT)
# NOTE: a larger int made the database raise OverflowError on write: a 500 on the admin API.
MAX_BYTES_LIMIT = (1 << 63) - 1  # largest byte quota stored (a signed 64-bit BIGINT)
# longest probe prompt or expected continuation a revision keeps (as a release's extra probes)
MAX_PROBE_TEXT_CHARS = 4096
UNSET = "unset (null; the CLI's --unset)"  # how a refusal names a lifted quota


def probe_text_error(field_name: str, text: object) -> str | None:
    """Why ``text`` cannot be a probe's prompt or expected text (a revision's or a release's),
    naming ``field_name``; None when it can: a string of 1 to ``MAX_PROBE_TEXT_CHARS``
    characters that UTF-8 can encode. NOTE: a lone surrogate (JSON's ``"\ud800"``, which
    Python's parser reads) was stored, and every admin answer showing it (a release's status,
    the release list holding it) was a 400 "Error serializing to JSON" from then on
    (docs/benchmarks/attack27.md)."""
    if not isinstance(text, str):
        return f"{field_name} {text!r} is invalid; expected a string"
    if not 0 < len(text) <= MAX_PROBE_TEXT_CHARS:
        return (
            f"{field_name} of {len(text)} characters is invalid; expected 1 to "
            f"{MAX_PROBE_TEXT_CHARS}"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{field_name} {text[exc.start : exc.end]!a} at character {exc.start} is "
            "invalid; expected text UTF-8 can encode (no lone surrogate)"
        )
    return None


@dataclass(frozen=True)
class TenantQuotas:
    """Per-tenant limits. ``None`` means unlimited."""

    max_gpu_bytes: int | None = None  # adapter bytes resident in GPU slots (L0)
    max_cpu_bytes: int | None = None  # adapter bytes resident in host memory (L1)
    max_disk_bytes: int | None = None  # adapter bytes in the local disk cache (L2)
    max_cold_loads: int | None = None  # concurrent loads of non-resident adapters
    max_requests_per_s: float | None = None  # sustained request rate
    max_running_seqs: int | None = None  # engine seats (running sequences) at most
    reserved_running_seqs: int = 0  # engine seats it gets before any fair share
    max_kv_blocks: int | None = None  # KV blocks its running sequences hold at most

    def __post_init__(self) -> None:
        for name in ("max_gpu_bytes", "max_cpu_bytes", "max_disk_bytes"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_BYTES_LIMIT:
                raise ValueError(
                    f"{name} {value} is invalid; expected {UNSET} or an int in "
                    f"[0, {MAX_BYTES_LIMIT}]"
                )
        if self.max_cold_loads is not None and not 1 <= self.max_cold_loads <= MAX_SEAT_LIMIT:
            raise ValueError(
                f"max_cold_loads {self.max_cold_loads} is invalid; expected {UNSET} or an int in "
                f"[1, {MAX_SEAT_LIMIT}]"
            )
        rate = self.max_requests_per_s
        if rate is not None and not (math.isfinite(rate) and rate > 0):  # unlimited is None
            raise ValueError(
                f"max_requests_per_s {rate} is invalid; expected {UNSET} or a finite number > 0"
            )
        self._check_seats()

    def _check_seats(self) -> None:
        for name in ("max_running_seqs", "max_kv_blocks"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_SEAT_LIMIT:
                raise ValueError(
                    f"{name} {value} is invalid; expected {UNSET} or an int in "
                    f"[1, {MAX_SEAT_LIMIT}]"
                )
        reserved, most = self.reserved_running_seqs, self.max_running_seqs
        if reserved is None or not 0 <= reserved <= MAX_SEAT_LIMIT:  # null: the API's explicit
            raise ValueError(
                f"reserved_running_seqs {reserved} is invalid; expected an int in "
                f"[0, {MAX_SEAT_LIMIT}]"
            )
        if most is not None and reserved > most:
            raise ValueError(
                f"reserved_running_seqs {reserved} is invalid; expected <= max_running_seqs {most}"
            )


@dataclass(frozen=True)
class Tenant:
    """A customer of the service: owns adapters and API keys."""

    name: str  # unique tenant name
    priority: PriorityClass  # residency/admission priority class
    quotas: TenantQuotas  # resource limits
    created_at: float  # wall-clock seconds since the epoch

    def __post_init__(self) -> None:
        check_name("tenant", self.name)


@dataclass(frozen=True)
class ApiKeyInfo:
    """An API key as stored: never the token itself, only its id and owner."""

    key_id: str  # public identifier embedded in the token; used to revoke
    tenant: str  # the one tenant the key authenticates as
    created_at: float  # wall-clock seconds since the epoch
    revoked_at: float | None  # when it was revoked; None while active


@dataclass(frozen=True)
class IssuedKey:
    """A newly created key. The token exists only here: it is shown once and never stored."""

    key_id: str  # public identifier, also inside the token
    tenant: str  # owning tenant
    token: str  # the secret bearer token (``lpx_<key_id>_<secret>``)


@dataclass(frozen=True)
class Adapter:
    """A named adapter of one tenant; its revisions hold the bytes."""

    tenant: str  # owning tenant
    name: str  # adapter name, unique within the tenant
    visibility: Visibility  # private (default) or public
    created_at: float  # wall-clock seconds since the epoch

    @property
    def ref(self) -> str:
        """``tenant/name``."""
        return f"{self.tenant}/{self.name}"


@dataclass(frozen=True)
class Provenance:
    """Who signed a revision's bytes, as verified at registration (never changed after)."""

    signature_digest: str  # sha256 of the bundle (model.sig), stored as an artifact object
    signer: str  # "key:<anchor>" or the signing certificate's subject
    trust_anchor: str  # the tenant's trust anchor that verified it (may be removed since)
    manifest_digest: str  # the signed statement's subject digest
    verified_at: float  # wall-clock seconds since the epoch


@dataclass(frozen=True)
class Revision:
    """One immutable adapter revision: content identity plus mutable release metadata.

    Everything down to ``created_at`` is fixed at registration (a database trigger refuses
    changes); ``state`` and ``warm_policy`` move with the release flow.
    """

    tenant: str  # owning tenant
    name: str  # adapter name
    revision: str  # immutable revision label
    adapter_digest: str  # sha256 of adapter_model.safetensors (the content digest)
    config_digest: str  # sha256 of adapter_config.json
    base_digest: str  # digest of the base model it was validated against
    compat_version: int  # runtime semantics version at registration
    max_rank: int  # largest rank over all injected modules
    lora_alpha: float  # default alpha from adapter_config.json
    use_rslora: bool  # alpha/sqrt(r) scaling
    target_modules: tuple[str, ...]  # injected module names (q_proj ... down_proj)
    dtype: str  # tensor dtype, e.g. "float16"
    tensor_bytes: int  # bytes of all LoRA tensors as stored
    estimated_bytes: int  # bytes the adapter occupies once loaded
    store_url: str  # the artifact store holding both objects
    created_at: float  # wall-clock seconds since the epoch
    state: RevisionState  # release state
    warm_policy: WarmPolicy  # residency policy for the adapter cache
    probe_prompt: str | None  # fixed prompt for the output probe, if any
    expected_continuation: str | None  # what the probe prompt must produce
    provenance: Provenance | None = None  # the verified signature; None when unsigned

    @property
    def ref(self) -> str:
        """``tenant/name@revision``."""
        return f"{self.tenant}/{self.name}@{self.revision}"

    def key(self) -> AdapterKey:
        """The cache identity of this revision."""
        return AdapterKey(
            base_digest=self.base_digest,
            tenant=self.tenant,
            name=self.name,
            revision=self.revision,
            adapter_digest=self.adapter_digest,
            compat_version=self.compat_version,
        )


@dataclass(frozen=True)
class AliasTarget:
    """One revision an alias routes to, with its integer traffic weight."""

    revision: str  # revision label of the alias's adapter
    weight: int  # relative share of requests (> 0)

    def __post_init__(self) -> None:
        check_name("revision", self.revision)
        if self.weight < 1:
            raise ValueError(f"weight {self.weight} is invalid; expected an int >= 1")


@dataclass(frozen=True)
class Alias:
    """``tenant/name`` -> weighted revisions, resolved per request (canary splits).

    ``rollback_targets`` is the top of the alias's history (``alias_history`` table): what the
    alias pointed at before its last change. A rollback pops it, so the next rollback goes one
    step further back, with no memory outside the registry.
    """

    tenant: str  # owning tenant
    name: str  # adapter name (the alias is the adapter's name)
    targets: tuple[AliasTarget, ...]  # current split; at least one
    rollback_targets: tuple[AliasTarget, ...]  # top of the history; empty when there is none
    updated_at: float  # wall-clock seconds since the epoch

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("targets () is invalid; expected at least one revision")
        revisions = [target.revision for target in self.targets]
        if len(set(revisions)) != len(revisions):
            raise ValueError(f"targets {revisions} is invalid; expected distinct revisions")


@dataclass(frozen=True)
class AuditEntry:
    """One administrative change, appended in the same transaction as the change."""

    seq: int  # position in the log (increasing)
    at: float  # wall-clock seconds since the epoch
    actor: str  # who made the change
    action: str  # what kind of change, e.g. "tenant.create"
    subject: str  # what it changed, e.g. "acme/support-bot@v2"
    details: dict[str, object] = field(default_factory=dict)  # JSON-serialisable specifics


@dataclass(frozen=True)
class RegistrationRequest:
    """What an administrator asks to register."""

    adapter_dir: Path  # PEFT directory: adapter_config.json + adapter_model.safetensors
    tenant: str  # owning tenant (must exist)
    name: str  # adapter name
    revision: str  # revision label (immutable once registered)
    state: RevisionState = RevisionState.STABLE  # initial release state
    warm_policy: WarmPolicy = WarmPolicy.ON_DEMAND  # initial residency policy
    probe_prompt: str | None = None  # output-probe prompt
    expected_continuation: str | None = None  # output-probe expectation
    visibility: Visibility = Visibility.PRIVATE  # used only when the adapter is new

    def __post_init__(self) -> None:
        check_name("tenant", self.tenant)
        check_name("name", self.name)
        check_name("revision", self.revision)
        if (self.probe_prompt is None) != (self.expected_continuation is None):
            raise ValueError(
                "probe_prompt and expected_continuation are invalid; expected both or neither"
            )
        # NOTE: kept forever with the revision and run by every release of it (its probe
        # generates as many tokens as the continuation has characters); an empty prompt left
        # the release stuck in probing, both revisions pinned, for good.
        for field_name in ("probe_prompt", "expected_continuation"):
            text = getattr(self, field_name)
            error = None if text is None else probe_text_error(field_name, text)
            if error is not None:
                raise ValueError(error)


@dataclass(frozen=True)
class RegistrationResult:
    """The outcome of a registration."""

    revision: Revision  # the registered (or already present) revision
    created: bool  # False when identical bytes were already registered (a no-op)
    # The validation's warnings (``ValidatedAdapter.warnings``): accepted, but said
    warnings: tuple[str, ...] = ()
