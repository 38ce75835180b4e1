"""``loraplex keys create/list/revoke``: tenants' API keys, registry-direct like the other
registry commands (same location options). A token is printed once; only its hash is stored.
"""

from __future__ import annotations

from typing import Annotated

import typer

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
    tenant_hint,
    utc_time,
)
from loraplex.cli.registry_location import Location, located
from loraplex.errors import RecordNotFoundError
from loraplex.registry.sql.paging import DEFAULT_PAGE


def register(app: typer.Typer) -> None:
    keys = command_group(app, "keys", "Tenant API keys.")
    keys.command("create")(located(create_key))
    keys.command("list")(located(list_keys))
    keys.command("revoke")(located(revoke_key))


def create_key(
    location: Location,
    tenant: Annotated[str, typer.Argument()],
    *,
    actor: Actor = None,
) -> None:
    """Create an API key. The token is printed once and cannot be shown again."""
    with failures(), opened(location.config()) as registry:
        try:
            issued = registry.create_key(tenant, acting(actor))
        except RecordNotFoundError as exc:  # the tenant (the only record it looks up)
            raise RecordNotFoundError(f"{exc}{tenant_hint(registry, tenant)}") from None
    typer.echo(f"key id {issued.key_id} for tenant {issued.tenant}; token (shown once):", err=True)
    typer.echo(issued.token)


def list_keys(
    location: Location,
    tenant: Annotated[str | None, typer.Option()] = None,
    *,
    limit: Limit = DEFAULT_PAGE,
    after: After = None,
) -> None:
    """List API keys (ids and state; tokens are never stored), by tenant, then age: one page,
    and on stderr the --after of the next one when more follow, or that there is none (stdout
    stays empty)."""
    with failures(), opened(location.config()) as registry:
        try:
            keys, next_after = one_page(
                lambda page: registry.list_keys(tenant, page), lambda key: key.key_id, after, limit
            )
        except RecordNotFoundError as exc:  # --tenant names no tenant (it listed no key)
            hint = "" if tenant is None else tenant_hint(registry, tenant)
            raise RecordNotFoundError(f"{exc}{hint}") from None
    for key in keys:
        state = "active" if key.revoked_at is None else f"revoked {utc_time(key.revoked_at)}"
        typer.echo(f"{key.key_id}\t{key.tenant}\tcreated {utc_time(key.created_at)}\t{state}")
    if not keys:
        none_listed("key", None if tenant is None else f"of tenant {tenant!r}", after)
    next_page("keys", next_after)


def revoke_key(
    location: Location,
    key_id: Annotated[str, typer.Argument()],
    *,
    actor: Actor = None,
) -> None:
    """Revoke an API key; it stops authenticating immediately."""
    with failures(), opened(location.config()) as registry:
        key, revoked_now = registry.revoke_key_once(key_id, acting(actor))
    if revoked_now:
        typer.echo(f"revoked key {key.key_id} of tenant {key.tenant}")
    else:  # NOTE: it printed "revoked key ..." though nothing was written (no audit row)
        when = utc_time(key.revoked_at or 0.0)
        typer.echo(f"key {key.key_id} of tenant {key.tenant} was already revoked at {when}")
