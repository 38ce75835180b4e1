"""One release cycle of ``loraplex bench release``, driven through the admin API.

A cycle uploads the candidate (``POST /admin/adapters/upload``), starts its release (``POST
/admin/releases``), polls ``GET /admin/releases/{tenant}/{name}`` until the release is terminal,
and, when it was rolled back after canary traffic, times how soon a user who was on the canary
gets an answer from the old revision again (``rollback_to_old_ms``). Meanwhile it sets what the
steady traffic's clients accept for that adapter (``Expectations``): the stable continuation,
plus the candidate's for a good cycle; a live-fail's clients reject the candidate's answers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from loraplex.bench.release.check import Answer, CycleOutcome
from loraplex.bench.release.load import (
    Expectations,
    Route,
    SteadyLoad,
    completion_body,
    stream_completion,
    to_answer,
)
from loraplex.bench.release.plan import CycleKind, CycleSpec, Sources, choose_sources

TERMINAL = frozenset({"promoted", "rolled_back", "aborted"})
FOLLOWUP = "followup"  # phase kind of the rollback-timing requests (checked, not in TTFT)


@dataclass(frozen=True)
class CycleSettings:
    """The release plan every cycle uses, and how the bench watches it."""

    ladder: tuple[float, ...] = (0.2, 0.5)  # canary shares
    dwell_s: float = 3.0  # minimum seconds per ladder step
    window_s: float = 10.0  # old stable stays pinned this long after promotion
    min_requests: int = 4  # candidate requests a step needs before it passes or breaches
    # Prewarm the candidate into a GPU slot too (the release's ``gpu``), as an operator would
    # for a hot adapter: its first canary requests then do not wait for an L1 -> L0 copy.
    gpu: bool = True
    poll_s: float = 0.25  # admin API polling period while a release runs (an operator's rate)
    cycle_timeout_s: float = 180.0  # a release not terminal by then is recorded as "timeout"
    rollback_deadline_s: float = 10.0  # how long the rollback timing may keep asking

    def __post_init__(self) -> None:
        if not self.ladder or any(not 0 < share <= 1 for share in self.ladder):
            raise ValueError(f"ladder {self.ladder} is invalid; expected shares in (0, 1]")
        for name in ("dwell_s", "window_s", "min_requests", "poll_s", "cycle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")

    def plan_body(self) -> dict[str, object]:
        return {
            "ladder": list(self.ladder),
            "dwell_s": self.dwell_s,
            "window_s": self.window_s,
            "gpu": self.gpu,
            "thresholds": {"min_requests": self.min_requests},
        }


@dataclass
class AdapterState:
    """What the bench knows of one released adapter between cycles."""

    route: Route  # how the traffic calls it
    stable: str  # revision label the alias serves
    stable_source: str  # demo revision whose files the stable revision has
    files: dict[str, Path]  # demo revision label -> its PEFT directory


class CycleRunner:
    """Runs cycles one after another against one server."""

    def __init__(
        self,
        admin: httpx.AsyncClient,
        load: SteadyLoad,
        adapters: dict[str, AdapterState],
        settings: CycleSettings,
    ) -> None:
        self.admin, self.load, self.adapters, self.settings = admin, load, adapters, settings
        self.followups: list[Answer] = []  # the rollback-timing requests

    @property
    def expectations(self) -> Expectations:
        return self.load.expectations

    async def run(self, spec: CycleSpec) -> CycleOutcome:
        state = self.adapters[spec.lineage.adapter]
        sources = choose_sources(spec, state.stable_source)
        texts = spec.lineage.continuations
        candidate = f"{spec.lineage.adapter}@{spec.label}"
        accepted = {texts[state.stable_source]}
        if spec.kind is CycleKind.GOOD:
            accepted.add(texts[sources.files_from])
        self.expectations.accepted[spec.lineage.adapter] = frozenset(accepted)
        started = time.monotonic()
        await self._register(spec, state, sources)
        release_id = await self._start(spec)
        release, observed = await self._wait_terminal(spec, release_id, started)
        outcome_state = str(release.get("state", "timeout")) if release else "timeout"
        canary_users = sorted({a.user for a in self.load.answers if a.revision == candidate})
        rollback_ms = None
        if outcome_state == "rolled_back" and canary_users:
            baseline = f"{spec.lineage.adapter}@{state.stable}"
            rollback_ms = await self._time_rollback(
                state.route, canary_users[0], baseline, observed
            )
        if outcome_state == "promoted":
            state.stable, state.stable_source = spec.label, sources.files_from
        return CycleOutcome(
            index=spec.index,
            adapter=spec.lineage.adapter,
            candidate=candidate,
            kind=spec.kind.value,
            files_from=sources.files_from,
            probe_from=sources.probe_from,
            state=outcome_state,
            reason=None if release is None else _text(release.get("reason")),
            duration_s=round(observed - started, 3),
            canary_users=len(canary_users),
            rollback_to_old_ms=rollback_ms,
        )

    async def _register(self, spec: CycleSpec, state: AdapterState, sources: Sources) -> None:
        directory = state.files[sources.files_from]
        fields = {
            "tenant": spec.lineage.tenant,
            "name": spec.lineage.name,
            "revision": spec.label,
            "state": "canary",
            "probe_prompt": state.route.prompt,
            "expected_continuation": spec.lineage.continuations[sources.probe_from],
        }
        files = {
            "config": ("adapter_config.json", (directory / "adapter_config.json").read_bytes()),
            "weights": (
                "adapter_model.safetensors",
                (directory / "adapter_model.safetensors").read_bytes(),
            ),
        }
        reply = await self.admin.post("/admin/adapters/upload", data=fields, files=files)
        _raise_for(reply, f"registering {spec.lineage.adapter}@{spec.label}")

    async def _start(self, spec: CycleSpec) -> str:
        body = {
            "tenant": spec.lineage.tenant,
            "name": spec.lineage.name,
            "revision": spec.label,
            **self.settings.plan_body(),
        }
        reply = await self.admin.post("/admin/releases", json=body)
        _raise_for(reply, f"starting the release of {spec.lineage.adapter}@{spec.label}")
        return str(_release_of(reply.json())["release_id"])

    async def _wait_terminal(
        self, spec: CycleSpec, release_id: str, started: float
    ) -> tuple[dict[str, object] | None, float]:
        """The terminal release record and the monotonic time the bench first saw it (None:
        not terminal within ``cycle_timeout_s``)."""
        path = f"/admin/releases/{spec.lineage.tenant}/{spec.lineage.name}"
        while time.monotonic() - started < self.settings.cycle_timeout_s:
            reply = await self.admin.get(path)
            _raise_for(reply, f"reading the release of {spec.lineage.adapter}")
            release = _release_of(reply.json())
            if release.get("release_id") == release_id and release.get("state") in TERMINAL:
                return release, time.monotonic()
            await asyncio.sleep(self.settings.poll_s)
        return None, time.monotonic()

    async def _time_rollback(
        self, route: Route, user: str, baseline: str, observed: float
    ) -> float | None:
        """Milliseconds from ``observed`` (rollback seen on the admin API) to the first text
        of an answer reporting ``baseline`` for ``user``, who was on the canary; requests are
        sent back to back, as that user, until one does (None: none within the deadline)."""
        key = self.load.keys[route.tenant]
        timeout_s = self.load.config.request_timeout_s
        while time.monotonic() - observed < self.settings.rollback_deadline_s:
            sent = time.monotonic()
            result = await stream_completion(
                self.load.url, key, completion_body(route, user), timeout_s
            )
            answer = to_answer(result, route, user, sent - observed, (FOLLOWUP, FOLLOWUP))
            ttft_s = None if result.first_s is None else result.first_s - sent
            self.followups.append(replace(answer, ttft_s=ttft_s))
            if result.revision == baseline and result.first_s is not None:
                return round((result.first_s - observed) * 1000, 2)
        return None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _release_of(payload: object) -> dict[str, object]:
    """The release record of an admin answer (``routes_release.release_view``)."""
    if isinstance(payload, dict):
        return payload
    raise RuntimeError(f"admin API answered {payload!r}; expected a release object")


def _raise_for(reply: httpx.Response, doing: str) -> None:
    if reply.status_code >= 300:
        raise RuntimeError(f"{doing}: admin API answered {reply.status_code}: {reply.text[:300]}")
