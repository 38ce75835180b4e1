"""``loraplex tenants update``: change a tenant's priority class, quotas and engine seats.

Registry-direct like the other registry commands (same location options). An option not given
keeps its stored value; ``--unset NAME`` lifts a quota (``reserved_running_seqs``: back to 0).
A server started later enforces the change from its start; a running one reads
``max_requests_per_s`` with the key on each request, and gets the rest from the admin API
(``PUT /admin/tenants/NAME``), which stores the same change and applies it at once.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated

import typer

from loraplex.cli.registry import (
    MAX_KV_BLOCKS_HELP,
    MAX_RUNNING_SEQS_HELP,
    PRIORITY_HELP,
    RESERVED_SEQS_HELP,
    MaxColdLoads,
    MaxCpuBytes,
    MaxDiskBytes,
    MaxGpuBytes,
    MaxRequestsPerS,
    limits_line,
    note_for_a_running_server,
    priority_class,
)
from loraplex.cli.registry_access import Actor, acting, command_group, failures, opened
from loraplex.cli.registry_location import Location, located
from loraplex.registry import TenantQuotas

QUOTA_NAMES = tuple(f.name for f in fields(TenantQuotas))
_UNSET_VALUE: dict[str, int | None] = {"reserved_running_seqs": 0}  # others: None (no cap)


def register(app: typer.Typer) -> None:
    tenants = command_group(app, "tenants", "Tenants and their limits.")
    tenants.command("update")(located(update_tenant))


def update_tenant(
    location: Location,
    name: Annotated[str, typer.Argument()],
    *,
    priority: Annotated[str | None, typer.Option(help=PRIORITY_HELP)] = None,
    max_gpu_bytes: MaxGpuBytes = None,
    max_cpu_bytes: MaxCpuBytes = None,
    max_disk_bytes: MaxDiskBytes = None,
    max_cold_loads: MaxColdLoads = None,
    max_requests_per_s: MaxRequestsPerS = None,
    max_running_seqs: Annotated[int | None, typer.Option(help=MAX_RUNNING_SEQS_HELP)] = None,
    reserved_running_seqs: Annotated[int | None, typer.Option(help=RESERVED_SEQS_HELP)] = None,
    max_kv_blocks: Annotated[int | None, typer.Option(help=MAX_KV_BLOCKS_HELP)] = None,
    unset: Annotated[
        list[str] | None,
        typer.Option(help=f"Lift a quota (repeatable): one of {', '.join(QUOTA_NAMES)}"),
    ] = None,
    actor: Actor = None,
) -> None:
    """Change a tenant's priority class and limits; what is not given stays as it is."""
    given = {
        "max_gpu_bytes": max_gpu_bytes,
        "max_cpu_bytes": max_cpu_bytes,
        "max_disk_bytes": max_disk_bytes,
        "max_cold_loads": max_cold_loads,
        "max_requests_per_s": max_requests_per_s,
        "max_running_seqs": max_running_seqs,
        "reserved_running_seqs": reserved_running_seqs,
        "max_kv_blocks": max_kv_blocks,
    }
    changes: dict[str, int | float | None] = {k: v for k, v in given.items() if v is not None}
    with failures():
        for quota in unset or []:
            if quota not in QUOTA_NAMES:
                raise ValueError(
                    f"--unset {quota!r} is invalid; expected one of {', '.join(QUOTA_NAMES)}"
                )
            if quota in changes:
                raise ValueError(f"--unset {quota} is invalid; --{quota.replace('_', '-')} sets it")
            changes[quota] = _UNSET_VALUE.get(quota)
        new_class = None if priority is None else priority_class(priority)
        if priority is None and not changes:
            raise ValueError("nothing to change; expected --priority, a quota option or --unset")
        with opened(location.config()) as registry:
            tenant = registry.set_tenant_limits(name, acting(actor), new_class, changes)
        typer.echo(limits_line(tenant))
    note_for_a_running_server(name, priority is not None, set(changes))
