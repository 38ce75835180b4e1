"""``loraplex release start|status|promote|rollback|abort|list``: controlled releases.

Registry-direct like the other registry commands (same location options): they write the
release's row; the serving process's controller (``loraplex serve``) does the work. Each prints
the release's state and its latest per-revision comparison; ``--json`` prints the record.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import alias
from loraplex.cli.alias import split_alias
from loraplex.cli.registry_access import Actor, acting, command_group, failures, opened, utc_time
from loraplex.cli.registry_location import Location, located
from loraplex.release.model import (
    ProbeCase,
    Release,
    ReleasePlan,
    ReleaseState,
    RevisionWindow,
    Thresholds,
)
from loraplex.release.store import ReleaseStore

AliasRef = Annotated[str, typer.Argument(help="tenant/name")]
Json = Annotated[bool, typer.Option("--json", help="Print the release record as JSON")]
_DEFAULT_PLAN = ReleasePlan()
_DEFAULT_LIMITS = Thresholds()
_DEFAULT_LADDER = ",".join(f"{share:.0%}" for share in _DEFAULT_PLAN.ladder)


def register(app: typer.Typer) -> None:
    group = command_group(
        app, "release", "Controlled releases: probe, canary, promote or roll back."
    )
    group.command("start")(located(start))
    group.command("status")(located(status))
    group.command("promote")(located(promote))
    group.command("rollback")(located(rollback))
    group.command("abort")(located(abort))
    group.command("list")(located(list_releases))
    alias.register(command_group(app, "adapters", "Adapter artifacts and revisions."))


def start(
    location: Location,
    alias: AliasRef,
    revision: Annotated[str, typer.Argument(help="The revision to release")],
    *,
    share: Annotated[str | None, typer.Option(help="One canary step: 5% or 0.05")] = None,
    ladder: Annotated[
        str | None, typer.Option(help="Increasing canary steps", show_default=_DEFAULT_LADDER)
    ] = None,
    dwell: Annotated[str, typer.Option(help="Minimum time per step: 60s, 10m, 1h")] = "60s",
    window: Annotated[str, typer.Option(help="Old revision kept pinned after it")] = "10m",
    gpu: Annotated[bool, typer.Option(help="Prewarm into GPU slots, not only CPU")] = False,
    probe_file: Annotated[Path | None, typer.Option(help="Extra probes, JSONL")] = None,
    auto_promote: Annotated[bool, typer.Option(help="Promote after the last step")] = True,
    max_error_rate: float = _DEFAULT_LIMITS.max_error_rate,
    max_error_rate_over_stable: float = _DEFAULT_LIMITS.max_error_rate_over_stable,
    max_ttft_p99_ratio: float = _DEFAULT_LIMITS.max_ttft_p99_ratio,
    max_tpot_p99_ratio: float = _DEFAULT_LIMITS.max_tpot_p99_ratio,
    max_bad_feedback_ratio: float = _DEFAULT_LIMITS.max_bad_feedback_ratio,
    min_requests: int = _DEFAULT_LIMITS.min_requests,
    min_latency_samples: Annotated[
        int, typer.Option(help="Latency samples per side before P99 ratios are judged")
    ] = _DEFAULT_LIMITS.min_latency_samples,
    max_step: Annotated[
        str | None,
        typer.Option(
            help="A step without enough traffic by then is rolled back",
            show_default="10 x --dwell, at least 1h",
        ),
    ] = None,
    base_model: Annotated[
        Path | None,
        typer.Option(envvar="LORAPLEX_BASE_MODEL", help="Served base model: checks the build"),
    ] = None,
    actor: Actor = None,
    as_json: Json = False,
) -> None:
    """Stage a release of REVISION onto the alias; the server's controller runs it."""
    with failures():
        limits = Thresholds(
            max_error_rate=max_error_rate,
            max_error_rate_over_stable=max_error_rate_over_stable,
            max_ttft_p99_ratio=max_ttft_p99_ratio,
            max_tpot_p99_ratio=max_tpot_p99_ratio,
            max_bad_feedback_ratio=max_bad_feedback_ratio,
            min_requests=min_requests,
            min_latency_samples=min_latency_samples,
            max_step_s=None if max_step is None else parse_duration("--max-step", max_step),
        )
        plan = ReleasePlan(
            ladder=_ladder(share, ladder),
            dwell_s=parse_duration("--dwell", dwell),
            window_s=parse_duration("--window", window),
            gpu=gpu,
            auto_promote=auto_promote,
            thresholds=limits,
            probes=() if probe_file is None else read_probes(probe_file),
        )
        tenant, name = split_alias(alias)
        base = None if base_model is None else BaseModelSpec.from_dir(base_model)
        with opened(location.config(), base) as registry:
            release = ReleaseStore(registry).start_release(
                tenant, name, revision, plan, actor=acting(actor)
            )
        _show(release, as_json)


def status(location: Location, alias: AliasRef, as_json: Json = False) -> None:
    """The alias's active release (else its latest) and its comparison table."""
    with failures(), opened(location.config()) as registry:
        _show(ReleaseStore(registry).latest_release(*split_alias(alias)), as_json)


def promote(
    location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False
) -> None:
    """Promote the canary now (remaining ladder steps are skipped)."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        _show(store.promote(*split_alias(alias), actor=acting(actor)), as_json)


def rollback(
    location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False
) -> None:
    """Canary: all traffic back to stable. Promoted: the alias back to the old revision."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        _show(store.rollback(*split_alias(alias), actor=acting(actor)), as_json)


def abort(location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False) -> None:
    """Stop a release before it serves canary traffic."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        _show(store.abort(*split_alias(alias), actor=acting(actor)), as_json)


def list_releases(
    location: Location,
    show_all: Annotated[bool, typer.Option("--all", help="Finished releases too")] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's")] = None,
    as_json: Json = False,
) -> None:
    """Releases in flight (``--all``: every release), oldest first."""
    with failures(), opened(location.config()) as registry:
        found = ReleaseStore(registry).list_releases(include_terminal=show_all, tenant=tenant)
    if as_json:
        typer.echo(json.dumps([release_dict(r) for r in found], indent=2))
        return
    for release in found:
        typer.echo(_headline(release))


# --- parsing -------------------------------------------------------------------------------------


def parse_share(flag: str, text: str) -> float:
    """``5%`` or ``0.05``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{flag} {text!r} is invalid; expected a share like 5% or 0.05 in (0, 1]")
    return value


def parse_duration(flag: str, text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h`` -> seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    raw = text.strip()
    scale = units.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        seconds = float(number) * scale
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0.0:
        raise ValueError(f"{flag} {text!r} is invalid; expected a duration like 60s, 10m or 1h")
    return seconds


def _ladder(share: str | None, ladder: str | None) -> tuple[float, ...]:
    if share is not None and ladder is not None:
        raise ValueError(
            "--share and --ladder are both given; expected one (--share X = --ladder X)"
        )
    if share is not None:
        return (parse_share("--share", share),)
    if ladder is None:
        return _DEFAULT_PLAN.ladder
    steps = tuple(parse_share("--ladder", part) for part in ladder.split(","))
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise ValueError(f"--ladder {ladder!r} is invalid; expected strictly increasing shares")
    return steps


def read_probes(path: Path) -> tuple[ProbeCase, ...]:
    """One JSON object per line: ``prompt`` and ``expected`` and/or ``differ_from_stable``,
    optional ``max_tokens``. Unknown keys are refused, naming the line."""
    known = {"prompt", "expected", "differ_from_stable", "max_tokens"}
    cases = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"--probe-file {path} line {number}"
        try:
            raw: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} is not JSON: {exc.msg}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{where} is invalid; expected a JSON object")
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}: keys {unknown} are unknown; expected {sorted(known)}")
        try:
            cases.append(ProbeCase(**raw))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from exc
    return tuple(cases)


# --- printing ------------------------------------------------------------------------------------


def release_dict(release: Release) -> dict[str, Any]:
    body = asdict(release)
    body["share"] = release.share
    return body


def _headline(release: Release) -> str:
    where = release.state.value
    if release.state is ReleaseState.CANARY:
        where += f" step {release.step + 1}/{len(release.plan.ladder)} ({release.share:.1%})"
    return (
        f"{release.release_id}\t{release.alias_ref}\t{release.baseline} -> {release.candidate}"
        f"\t{where}"
    )


def _show(release: Release, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(release_dict(release), indent=2))
        return
    typer.echo(_headline(release))
    if release.reason:
        typer.echo(f"reason\t{release.reason}")
    waiting = _waiting(release)
    if waiting is not None:
        typer.echo(waiting)
    now = time.time()  # the registry's wall clock: hold_until and comparisons are epoch seconds
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


def _waiting(release: Release) -> str | None:
    """What the release waits for, when it waits on something outside it: the serving process
    moves a release (the CLI only writes it), and a canary step passes only with traffic."""
    if release.state is ReleaseState.STAGED:
        return "waiting for a server: `loraplex serve` (or a fleet) on this registry moves it on"
    if release.state is not ReleaseState.CANARY:
        return None
    comparison = release.comparison
    seen = shown = 0
    if comparison is not None and comparison.step == release.step:
        seen = comparison.candidate.without_top_callers().requests  # what the step counts
        shown = comparison.candidate.requests  # the table's figure
    needed = release.plan.thresholds.min_requests
    if seen >= needed:
        return None
    # NOTE: the table below shows every request; the step counts fewer (docs/releases.md,
    # callers), which read as a miscount when the line gave the smaller number alone.
    left_out = "" if shown == seen else f" of {shown}, less the top callers by successes/failures"
    return (
        f"waiting for traffic: step {release.step + 1} passes after {needed} candidate requests "
        f"({seen} so far{left_out}) and {release.plan.dwell_s:g} s; {release.share:.1%} of the "
        f"callers of {release.alias_ref} get the candidate"
    )


def _row(revision: str, role: str, window: RevisionWindow) -> str:
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f}"

    rate = "-" if window.error_rate is None else f"{window.error_rate:.3f}"
    return (
        f"{revision}\t{role}\t{window.requests}\t{window.callers}\t{window.errors}\t{rate}"
        f"\t{ms(window.ttft_p99_s)}\t{ms(window.tpot_p99_s)}\t{window.good}\t{window.bad}"
    )
