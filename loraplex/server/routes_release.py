"""The release admin API under /admin/releases (admin credential, admin listener).

Routes only write the registry database through ``ReleaseStore``; the serving process's
release controller (``serve/release_env.py``) picks the change up at its next tick. Errors are
the registry's (``release/errors.py``, mapped in ``server/errors.py``): an unknown adapter or
release is a 404, a refused start a 400 naming why, a transition the release's state does not
allow (or one that lost a race) a 409.

A release's status carries its comparison table: the latest canary judgement the controller
persisted (candidate vs stable over the current step), plus this server's live windows since
the step started.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends

from loraplex.release.model import Comparison, Release, RevisionWindow
from loraplex.release.probes import unprobed_warning
from loraplex.release.shown import shown
from loraplex.release.store import ReleaseStore
from loraplex.server.admin_models import PageDep, StartReleaseBody
from loraplex.server.auth import ADMIN_ACTOR, DepsDep, require_admin
from loraplex.server.deps import ServerDeps
from loraplex.server.json_route import IdentityBodyRoute

router = APIRouter(
    prefix="/admin/releases", dependencies=[Depends(require_admin)], route_class=IdentityBodyRoute
)
# The rows of the comparison table, in order: ``RevisionWindow`` figures.
TABLE_ROWS = (
    "requests",
    "errors",
    "error_rate",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "ttft_p99_judged_s",  # what the ratio is judged on: without the extreme callers
    "tpot_p99_judged_s",
    "good",
    "bad",
)


def _store(deps: ServerDeps) -> ReleaseStore:
    return ReleaseStore(deps.registry)


def comparison_table(candidate: RevisionWindow, stable: RevisionWindow) -> list[dict[str, Any]]:
    """One row per figure: ``{"metric", "candidate", "stable"}``."""
    cand, base = _figures(candidate), _figures(stable)
    return [{"metric": row, "candidate": cand[row], "stable": base[row]} for row in TABLE_ROWS]


def _figures(window: RevisionWindow) -> dict[str, Any]:
    figures: dict[str, Any] = asdict(window)
    figures["error_rate"] = window.error_rate
    return figures


def _judged(comparison: Comparison | None) -> dict[str, Any] | None:
    if comparison is None:
        return None
    return {
        "step": comparison.step,
        "at": comparison.at,
        "passed": comparison.passed,
        "breaches": list(comparison.breaches),
        "table": comparison_table(comparison.candidate, comparison.stable),
    }


def release_view(release: Release, deps: ServerDeps | None = None) -> dict[str, Any]:
    """A release as the API shows it; with ``deps``, also this server's live windows. Made safe
    to send (``release/shown.py``): a value stored before today's bounds (a lone surrogate, an
    infinite duration) is U+FFFD or null, and named in ``invalid``, so one old release never
    fails a page of them."""
    view: dict[str, Any] = asdict(release)
    view.pop("comparison")
    view["state"] = release.state.value
    view["share"] = release.share
    view["candidate_ref"] = release.candidate_ref
    view["baseline_ref"] = release.baseline_ref
    view["comparison"] = _judged(release.comparison)
    if deps is not None and release.step_started_at is not None and not release.terminal:
        since = release.step_started_at
        live_candidate = deps.releases.window(release.candidate_ref, since)
        live_stable = deps.releases.window(release.baseline_ref, since)
        view["live"] = {"since": since, "table": comparison_table(live_candidate, live_stable)}
    else:
        view["live"] = None
    return shown(view)


@router.post("", status_code=201)
def start_release(body: StartReleaseBody, deps: DepsDep) -> Any:
    plan = body.plan()
    release = _store(deps).start_release(
        body.tenant, body.name, body.revision, plan, actor=ADMIN_ACTOR
    )
    warning = unprobed_warning(deps.registry.get_revision(release.candidate_ref), plan.probes)
    return {**release_view(release), "warnings": [] if warning is None else [warning]}


@router.get("")
def list_releases(
    deps: DepsDep, page: PageDep, tenant: str | None = None, finished: bool = False
) -> Any:
    """Releases in flight (``finished=true``: finished ones too), oldest first, one page; the
    next page is ``after`` = the last ``release_id``. NOTE: unpaged, ``finished=true`` read
    every release ever made into one answer."""
    releases = _store(deps).list_releases(include_terminal=finished, tenant=tenant, page=page)
    return [release_view(release) for release in releases]


@router.get("/{tenant}/{name}")
def release_status(tenant: str, name: str, deps: DepsDep) -> Any:
    """The alias's release in flight, else its latest one, with the comparison table."""
    return release_view(_store(deps).latest_release(tenant, name), deps)


@router.post("/{tenant}/{name}/promote")
def promote(tenant: str, name: str, deps: DepsDep) -> Any:
    promoted = _store(deps).promote(tenant, name, actor=ADMIN_ACTOR)
    deps.releases.count_transition(promoted.state.value, promoted.release_id)
    return release_view(promoted, deps)


@router.post("/{tenant}/{name}/rollback")
def rollback(tenant: str, name: str, deps: DepsDep) -> Any:
    rolled_back = _store(deps).rollback(tenant, name, actor=ADMIN_ACTOR)
    deps.releases.count_transition(rolled_back.state.value, rolled_back.release_id)
    return release_view(rolled_back, deps)


@router.post("/{tenant}/{name}/abort")
def abort(tenant: str, name: str, deps: DepsDep) -> Any:
    aborted = _store(deps).abort(tenant, name, actor=ADMIN_ACTOR)
    deps.releases.count_transition(aborted.state.value, aborted.release_id)
    return release_view(aborted, deps)
