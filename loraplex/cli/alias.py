"""``loraplex adapters alias show|set|rollback|history``: manual alias moves.

While a release owns an alias these refuse to move it (``release rollback|abort`` first); each
``set`` pushes the previous targets on the alias's history and each ``rollback`` pops one.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from loraplex.cli.registry_access import Actor, acting, failures, opened, targets_text, utc_time
from loraplex.cli.registry_location import Location, located
from loraplex.registry import Alias, AliasTarget

AliasRef = Annotated[str, typer.Argument(help="tenant/name")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON")]


def register(adapters: typer.Typer) -> None:
    group = typer.Typer(help="An adapter's alias: its weighted targets and history.")
    adapters.add_typer(group, name="alias")
    group.command("show")(located(show))
    group.command("set")(located(set_targets))
    group.command("rollback")(located(rollback))
    group.command("history")(located(history))


def show(location: Location, alias: AliasRef, as_json: Json = False) -> None:
    """The alias's targets and its rollback target."""
    with failures(), opened(location.config()) as registry:
        found = registry.get_alias(*split_alias(alias))
        if found is None:
            raise ValueError(f"alias {alias!r} has no targets")
        _print(found, as_json)


def set_targets(
    location: Location,
    alias: AliasRef,
    targets: Annotated[list[str], typer.Argument(help="REVISION[:WEIGHT] ...")],
    actor: Actor = None,
    as_json: Json = False,
) -> None:
    """Point the alias at TARGETS (weight 1 when omitted); the old targets go on its history."""
    with failures():
        parsed = tuple(parse_target(text) for text in targets)
        with opened(location.config()) as registry:
            tenant, name = split_alias(alias)
            _print(registry.set_alias(tenant, name, parsed, acting(actor)), as_json)


def rollback(
    location: Location, alias: AliasRef, actor: Actor = None, as_json: Json = False
) -> None:
    """Return the alias to its previous targets (again: one step further back)."""
    with failures(), opened(location.config()) as registry:
        tenant, name = split_alias(alias)
        _print(registry.rollback_alias(tenant, name, acting(actor)), as_json)


def history(location: Location, alias: AliasRef, as_json: Json = False) -> None:
    """Earlier targets, newest first: ROLLBACKS is how many ``alias rollback`` reach each."""
    with failures(), opened(location.config()) as registry:
        entries = registry.alias_history(*split_alias(alias))
    if as_json:
        body = [
            {"rollbacks": depth, "targets": _targets(t), "replaced_at": at}
            for depth, (t, at) in enumerate(entries, start=1)
        ]
        typer.echo(json.dumps(body, indent=2))
        return
    if not entries:
        # NOTE: "it was never moved" was wrong after a promotion rolled back: rollbacks pop the
        # history, so an alias moved and rolled back has none left either
        typer.echo(
            f"alias {alias} has no history: it was never moved, or every move was rolled back, "
            "so there is no rollback"
        )
        return
    typer.echo("rollbacks\ttargets\treplaced_at")
    for depth, (targets, at) in enumerate(entries, start=1):
        typer.echo(f"{depth}\t{targets_text(targets)}\t{utc_time(at)}")


def split_alias(text: str) -> tuple[str, str]:
    tenant, slash, name = text.partition("/")
    if not slash or not tenant or not name or "@" in name:
        raise ValueError(f"alias {text!r} is invalid; expected tenant/name")
    return tenant, name


def parse_target(text: str) -> AliasTarget:
    revision, _, weight = text.partition(":")
    try:
        return AliasTarget(revision, int(weight) if weight else 1)
    except ValueError as exc:
        raise ValueError(f"target {text!r} is invalid; expected REVISION[:WEIGHT]: {exc}") from exc


def _print(alias: Alias, as_json: bool) -> None:
    if as_json:
        body = {
            "alias": f"{alias.tenant}/{alias.name}",
            "targets": _targets(alias.targets),
            "rollback_targets": _targets(alias.rollback_targets),
            "updated_at": alias.updated_at,
        }
        typer.echo(json.dumps(body, indent=2))
        return
    typer.echo(f"alias       {alias.tenant}/{alias.name}")
    typer.echo(f"targets     {targets_text(alias.targets)}")
    typer.echo(f"rollback    {targets_text(alias.rollback_targets) or '-'}")


def _targets(targets: tuple[AliasTarget, ...]) -> list[dict[str, object]]:
    return [{"revision": t.revision, "weight": t.weight} for t in targets]
