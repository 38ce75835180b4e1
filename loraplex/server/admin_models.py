"""Request bodies of the admin API."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Query
from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from loraplex.artifacts.identity import check_name
from loraplex.errors import InvalidRequestError, quoted
from loraplex.registry import (
    PriorityClass,
    RevisionState,
    TenantQuotas,
    Visibility,
    WarmPolicy,
)
from loraplex.registry.models import MAX_PROBE_TEXT_CHARS
from loraplex.registry.sql.paging import (
    DEFAULT_PAGE,
    MAX_CURSOR_CHARS,
    MAX_PAGE,
    Page,
    every_row,
)
from loraplex.release.model import (
    MAX_LADDER_STEPS,
    MAX_PLAN_SECONDS,
    MAX_PROBE_TOKENS,
    MAX_PROBES,
    ProbeCase,
    ReleasePlan,
    Thresholds,
)
from loraplex.residency.ledger import Tier
from loraplex.server.protocol.fields import FirstUnknownKeyBody

TIER_NAMES = {"L0": Tier.L0, "gpu": Tier.L0, "L1": Tier.L1, "cpu": Tier.L1, "L2": Tier.L2}


class _Body(FirstUnknownKeyBody):
    """An admin body: an unknown key is a 400 naming the first one (``extra="forbid"``), and a
    number field refuses NaN and +/-inf (JSON's non-standard ``NaN`` / ``Infinity``, which
    Python's parser reads): no admin setting gives infinity a meaning. Booleans and numbers are
    ``StrictBool`` / ``StrictInt`` / ``StrictFloat``, as in the tenant bodies: ``"yes"``, ``"1"``,
    ``1.0`` or ``true`` where a bool or an int belongs is a 400 naming the field, not a value
    pydantic's lax mode converted (an int is still a valid float)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class QuotasBody(_Body):
    max_gpu_bytes: StrictInt | None = None
    max_cpu_bytes: StrictInt | None = None
    max_disk_bytes: StrictInt | None = None
    max_cold_loads: StrictInt | None = None
    max_requests_per_s: StrictFloat | None = None
    max_running_seqs: StrictInt | None = None
    reserved_running_seqs: StrictInt = 0
    max_kv_blocks: StrictInt | None = None

    def quotas(self) -> TenantQuotas:
        return TenantQuotas(**self.model_dump())


def check_gpu_cap(max_gpu_bytes: int | None, slot_bytes: int | None) -> None:
    """Raises InvalidRequestError (400 naming ``quotas.max_gpu_bytes``) for a tenant GPU cap
    below one GPU slot of ``slot_bytes`` (None: the slot is not known, nothing is checked).
    Every adapter's GPU copy takes a whole max-rank slot, so such a cap (``0`` included: no code
    gives it a meaning of its own) refused every adapter request of the tenant, for good, with
    a 422 that blamed its adapter; ``serve --gpu-adapter-bytes`` below one slot is refused too."""
    if max_gpu_bytes is None or slot_bytes is None or max_gpu_bytes >= slot_bytes:
        return
    raise InvalidRequestError(
        f"quotas.max_gpu_bytes {max_gpu_bytes} is invalid; expected null (no cap) or at least "
        f"one GPU slot of {slot_bytes} bytes (every adapter's GPU copy takes a whole slot, so "
        "a smaller cap would refuse every adapter request of the tenant)",
        "quotas.max_gpu_bytes",
    )


class TenantBody(_Body):
    name: str

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        """The registry's own check, here so that its 400 names the field."""
        return check_name("tenant", name)

    priority: PriorityClass = PriorityClass.NORMAL
    quotas: QuotasBody = Field(default_factory=QuotasBody)


class ReleaseFields(_Body):
    state: RevisionState = RevisionState.STABLE
    warm_policy: WarmPolicy = WarmPolicy.ON_DEMAND
    visibility: Visibility = Visibility.PRIVATE
    probe_prompt: str | None = None
    expected_continuation: str | None = None


class RegisterBody(ReleaseFields):
    """Register a PEFT directory that already sits on the server, inside the import directory."""

    path: str  # relative to the configured import directory
    tenant: str
    name: str
    revision: str


class UploadFields(ReleaseFields):
    """The text fields of an upload (its files are the ``config`` and ``weights`` parts)."""

    tenant: str
    name: str
    revision: str


class ReleaseBody(_Body):
    state: RevisionState | None = None
    warm_policy: WarmPolicy | None = None


class AliasTargetBody(_Body):
    revision: str
    weight: StrictInt = 1


class AliasBody(_Body):
    targets: list[AliasTargetBody] = Field(min_length=1)


class VisibilityBody(_Body):
    visibility: Visibility


class ResidencyBody(_Body):
    """An operator action on one revision's residency."""

    model: str  # tenant/name@revision
    tier: str = "L0"  # L0 (gpu), L1 (cpu) or L2
    wait: StrictBool = False  # answer only when the load finished

    def cache_tier(self) -> Tier:
        if self.tier not in TIER_NAMES:
            raise ValueError(
                f"tier {quoted(self.tier)} is invalid; expected one of {sorted(TIER_NAMES)}"
            )
        return TIER_NAMES[self.tier]


# --- releases (issue 13) -------------------------------------------------------------------------


class ThresholdsBody(_Body):
    """Overrides of ``release.model.Thresholds``; a field left out keeps its documented default."""

    max_error_rate: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    max_error_rate_over_stable: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    max_ttft_p99_ratio: StrictFloat | None = Field(default=None, gt=0.0)
    max_tpot_p99_ratio: StrictFloat | None = Field(default=None, gt=0.0)
    max_bad_feedback_ratio: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    min_requests: StrictInt | None = Field(default=None, ge=1)
    min_latency_samples: StrictInt | None = Field(default=None, ge=1)
    # left out: 10 x dwell_s, >= 1 h
    max_step_s: StrictFloat | None = Field(default=None, gt=0.0, le=MAX_PLAN_SECONDS)

    def thresholds(self) -> Thresholds:
        return Thresholds(**self.model_dump(exclude_none=True))


class ProbeBody(_Body):
    """One extra output probe (``release.model.ProbeCase``)."""

    prompt: str = Field(min_length=1, max_length=MAX_PROBE_TEXT_CHARS)
    expected: str | None = Field(default=None, min_length=1, max_length=MAX_PROBE_TEXT_CHARS)
    differ_from_stable: StrictBool = False
    max_tokens: StrictInt = Field(default=16, ge=1, le=MAX_PROBE_TOKENS)

    @model_validator(mode="after")
    def _checks_something(self) -> ProbeBody:
        if self.expected is None and not self.differ_from_stable:
            raise ValueError("a probe needs expected, or differ_from_stable true")
        return self


class StartReleaseBody(_Body):
    """``POST /admin/releases``: release ``tenant/name@revision`` onto the alias ``tenant/name``.
    Plan fields left out keep ``release.model.ReleasePlan``'s defaults."""

    tenant: str = Field(min_length=1)
    name: str = Field(min_length=1)
    revision: str = Field(min_length=1)
    ladder: list[Annotated[StrictFloat, Field(gt=0.0, le=1.0)]] | None = Field(
        default=None, min_length=1, max_length=MAX_LADDER_STEPS
    )
    dwell_s: StrictFloat | None = Field(default=None, ge=0.0, le=MAX_PLAN_SECONDS)
    window_s: StrictFloat | None = Field(default=None, ge=0.0, le=MAX_PLAN_SECONDS)
    gpu: StrictBool = False
    auto_promote: StrictBool = True
    probes: list[ProbeBody] = Field(default_factory=list, max_length=MAX_PROBES)
    thresholds: ThresholdsBody = Field(default_factory=ThresholdsBody)

    @field_validator("ladder")
    @classmethod
    def _increasing(cls, ladder: list[float] | None) -> list[float] | None:
        if ladder is not None and any(b <= a for a, b in itertools.pairwise(ladder)):
            raise ValueError("ladder shares must increase strictly")
        return ladder

    def plan(self) -> ReleasePlan:
        fields: dict[str, Any] = {"gpu": self.gpu, "auto_promote": self.auto_promote}
        if self.ladder is not None:
            fields["ladder"] = tuple(self.ladder)
        for name in ("dwell_s", "window_s"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        probes = tuple(ProbeCase(**probe.model_dump()) for probe in self.probes)
        return ReleasePlan(**fields, thresholds=self.thresholds.thresholds(), probes=probes)


async def admin_page(
    after: Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR_CHARS)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> Page:
    """The ``after`` / ``limit`` query parameters of a paged admin listing (``sql/paging.py``):
    at most ``limit`` rows after the row ``after`` names (the last one seen); ``async``, so
    FastAPI runs it on the event loop, not the thread pool."""
    return Page(after, limit)


PageDep = Annotated[Page, Depends(admin_page)]


def shown_with_every_revision(
    get: Callable[[str, dict[str, Any]], Any], tenant: str, name: str
) -> dict[str, Any]:
    """``GET /admin/adapters/{tenant}/{name}`` with every revision, for a client of the admin
    API: ``get(path, params)`` is one call's parsed answer, whose ``revisions`` are one page;
    the rest are read page by page (the adapter and alias are the first answer's)."""
    path = f"/admin/adapters/{tenant}/{name}"
    answers: list[dict[str, Any]] = []

    def read(page: Page) -> list[dict[str, Any]]:
        answers.append(get(path, page.params()))
        revisions: list[dict[str, Any]] = answers[-1]["revisions"]
        return revisions

    revisions = list(every_row(read, lambda revision: str(revision["revision"])))
    return {**answers[0], "revisions": revisions}
