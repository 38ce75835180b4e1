"""``loraplex release start|status|promote|rollback|abort|list``: controlled releases.

Registry-direct like the other registry commands (same location options): they write the
release's row; the serving process's controller (``loraplex serve``) does the work. Each prints
the release's state and its latest per-revision comparison (``release_show.py``); ``--json``
prints the record. ``release start``'s options are parsed by ``release_input.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import alias
from loraplex.cli.alias import split_alias
from loraplex.cli.registry_access import (
    Actor,
    After,
    Limit,
    acting,
    command_group,
    failures,
    next_page,
    none_listed,
    one_page,
    opened,
)
from loraplex.cli.registry_location import Location, located
from loraplex.cli.release_input import parse_duration, parse_ladder, read_probes
from loraplex.cli.release_show import headline, release_dict, show_release
from loraplex.registry.sql.paging import DEFAULT_PAGE
from loraplex.release.model import ReleasePlan, Thresholds
from loraplex.release.probes import unprobed_warning
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
            ladder=parse_ladder(share, ladder),
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
            candidate = registry.get_revision(release.candidate_ref)
        show_release(release, as_json)
        warning = unprobed_warning(candidate, plan.probes)
        if warning is not None:
            typer.echo(f"warning: {warning}", err=True)


def status(location: Location, alias: AliasRef, as_json: Json = False) -> None:
    """The alias's active release (else its latest) and its comparison table."""
    with failures(), opened(location.config()) as registry:
        show_release(ReleaseStore(registry).latest_release(*split_alias(alias)), as_json)


def promote(
    location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False
) -> None:
    """Promote the canary now (remaining ladder steps are skipped)."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        show_release(store.promote(*split_alias(alias), actor=acting(actor)), as_json)


def rollback(
    location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False
) -> None:
    """Canary: all traffic back to stable. Promoted: the alias back to the old revision."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        show_release(store.rollback(*split_alias(alias), actor=acting(actor)), as_json)


def abort(location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False) -> None:
    """Stop a release before it serves canary traffic."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        show_release(store.abort(*split_alias(alias), actor=acting(actor)), as_json)


def list_releases(
    location: Location,
    show_all: Annotated[bool, typer.Option("--all", help="Finished releases too")] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's")] = None,
    as_json: Json = False,
    *,
    limit: Limit = DEFAULT_PAGE,
    after: After = None,
) -> None:
    """Releases in flight (``--all``: every release), oldest first: one page, and on stderr the
    --after (a release id) of the next one when more follow, or that there is none (stdout
    stays empty for scripts; it printed nothing at all, which read as a command that failed)."""
    with failures(), opened(location.config()) as registry:
        store = ReleaseStore(registry)
        found, next_after = one_page(
            lambda page: store.list_releases(include_terminal=show_all, tenant=tenant, page=page),
            lambda release: release.release_id,
            after,
            limit,
        )
    if as_json:
        typer.echo(json.dumps([release_dict(r) for r in found], indent=2))
    else:
        for release in found:
            typer.echo(headline(release))
        if not found:
            none_listed(
                "release" if show_all else "release in flight",
                None if tenant is None else f"of tenant {tenant!r}",
                after,
                None if show_all else "--all lists finished ones too",
            )
    next_page("releases", next_after)
