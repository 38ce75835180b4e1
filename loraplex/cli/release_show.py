"""How the ``loraplex release`` commands print a release: its headline, what it waits for, the
hold on the old revision and the latest per-revision comparison; ``--json``: the record."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import typer

from loraplex.cli.registry_access import utc_time
from loraplex.release.model import Release, ReleaseState, RevisionWindow
from loraplex.release.shown import shown


def release_dict(release: Release) -> dict[str, Any]:
    """The record as ``--json`` prints it, made safe to print (``release/shown.py``: a value
    stored before today's bounds is null or U+FFFD there, and named in ``invalid``)."""
    body = asdict(release)
    body["share"] = release.share
    return shown(body)


def headline(release: Release) -> str:
    where = release.state.value
    if release.state is ReleaseState.CANARY:
        where += f" step {release.step + 1}/{len(release.plan.ladder)} ({release.share:.1%})"
    return (
        f"{release.release_id}\t{release.alias_ref}\t{release.baseline} -> {release.candidate}"
        f"\t{where}"
    )


def show_release(release: Release, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(release_dict(release), indent=2))
        return
    typer.echo(headline(release))
    body = release_dict(release)
    for problem in body["invalid"]:  # stored before today's bounds: shown made safe
        typer.echo(f"invalid\t{problem}")
    if body["reason"]:
        typer.echo(f"reason\t{body['reason']}")
    now = time.time()  # the registry's wall clock: hold_until and comparisons are epoch seconds
    waiting = _waiting(release, now)
    if waiting is not None:
        typer.echo(waiting)
    if release.hold_until is not None:
        left = release.hold_until - now
        when = f"{left:.0f} s from now" if left > 0 else "over; released at the next tick"
        typer.echo(f"holding {release.baseline} until {utc_time(release.hold_until)} ({when})")
    comparison = release.comparison
    if comparison is None:
        return
    typer.echo(
        f"step {comparison.step + 1} compared at {utc_time(comparison.at)} "
        f"({max(now - comparison.at, 0.0):.0f} s ago){' (passed)' if comparison.passed else ''}"
    )
    typer.echo(
        "revision\trole\trequests\tcallers\terrors\terror_rate\tttft_p99_ms\ttpot_p99_ms\tgood\tbad"
    )
    typer.echo(_row(release.candidate, "candidate", comparison.candidate))
    typer.echo(_row(release.baseline, "stable", comparison.stable))
    for breach in comparison.breaches:
        typer.echo(f"breach\t{breach}")


def _waiting(release: Release, now: float) -> str | None:
    """What the release waits for, when it waits on something outside it: the serving process
    moves a release (the CLI only writes it), a canary step passes only with traffic and after
    its dwell, and a release without auto-promote waits for ``release promote``."""
    if release.state is ReleaseState.STAGED:
        # NOTE: printed by ``release start`` too, where a running fleet had not yet picked it up:
        # an operator with one running read it as "no server found"
        return (
            "waiting for a server: `loraplex serve` (or a fleet) on this registry moves it on "
            "(a running one within seconds; `release status` follows it)"
        )
    if release.state is not ReleaseState.CANARY:
        return None
    comparison = release.comparison
    seen = shown = 0
    if comparison is not None and comparison.step == release.step:
        seen = comparison.candidate.without_top_callers().requests  # what the step counts
        shown = comparison.candidate.requests  # the table's figure
    needed = release.plan.thresholds.min_requests
    if seen >= needed:
        # NOTE: the status said nothing here, so a step with its requests but not its dwell (or
        # a last step passed under --no-auto-promote) read as stuck.
        return _waiting_beyond_traffic(release, now)
    # NOTE: the table below shows every request; the step counts fewer (docs/releases.md,
    # callers), which read as a miscount when the line gave the smaller number alone.
    left_out = "" if shown == seen else f" of {shown}, less the top callers by successes/failures"
    return (
        f"waiting for traffic: step {release.step + 1} passes after {needed} candidate requests "
        f"({seen} so far{left_out}) and {release.plan.dwell_s:g} s; {release.share:.1%} of the "
        f"callers of {release.alias_ref} get the candidate"
    )


def _waiting_beyond_traffic(release: Release, now: float) -> str | None:
    """A canary step that has its requests: it waits for the operator (the last step passed,
    no auto-promote) or for its dwell; None once neither holds it (the next tick judges it)."""
    step, comparison = release.step + 1, release.comparison
    if comparison is not None and comparison.step == release.step and comparison.passed:
        return (
            f"waiting for an operator: step {step} passed and the release was started with "
            f"--no-auto-promote; `loraplex release promote {release.alias_ref}` promotes it"
        )
    if release.step_started_at is None:
        return None
    ends = release.step_started_at + release.plan.dwell_s
    if ends <= now:
        return None
    return (
        f"waiting for time: step {step} has its {release.plan.thresholds.min_requests} "
        f"candidate requests and passes once it has run {release.plan.dwell_s:g} s (--dwell), "
        f"at {utc_time(ends)} ({ends - now:.0f} s from now)"
    )


def _row(revision: str, role: str, window: RevisionWindow) -> str:
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f}"

    rate = "-" if window.error_rate is None else f"{window.error_rate:.3f}"
    return (
        f"{revision}\t{role}\t{window.requests}\t{window.callers}\t{window.errors}\t{rate}"
        f"\t{ms(window.ttft_p99_s)}\t{ms(window.tpot_p99_s)}\t{window.good}\t{window.bad}"
    )
