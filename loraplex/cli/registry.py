"""``loraplex adapters register/register-many/list/show``, ``loraplex tenants create/list``: the
registry's administrative commands (``keys`` in ``cli/keys.py``, what they share in
``cli/registry_access.py``).

Every command takes the registry location: ``--data-dir`` (``LORAPLEX_DATA_DIR``),
``--database-url`` (``LORAPLEX_DATABASE_URL``), ``--store`` (``LORAPLEX_STORE``: a directory or
``s3://bucket/prefix``) and ``--s3-endpoint`` (``LORAPLEX_S3_ENDPOINT``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli.enum_choice import choice_of
from loraplex.cli.registry_access import (
    Actor,
    After,
    Limit,
    acting,
    command_group,
    failures,
    listed,
    next_page,
    none_listed,
    one_page,
    opened,
    provenance_line,
    require_tenant,
    targets_text,
    utc_time,
)
from loraplex.cli.registry_location import Location, located
from loraplex.registry import (
    PriorityClass,
    RegistrationRequest,
    RevisionState,
    Tenant,
    TenantQuotas,
    Visibility,
    WarmPolicy,
)
from loraplex.registry.sql.paging import DEFAULT_PAGE

BaseModelDir = Annotated[
    Path, typer.Option(envvar="LORAPLEX_BASE_MODEL", help="The served base model directory")
]
MaxLoraRank = Annotated[int, typer.Option(help="Largest rank accepted")]
MAX_RUNNING_SEQS_HELP = "Engine seats (running sequences) at most (default: no cap)"
RESERVED_SEQS_HELP = "Engine seats it gets before any other tenant's fair share"
MAX_KV_BLOCKS_HELP = "KV blocks its running sequences hold at most (default: no cap)"
_SHARE = "(default: no cap; serve's default_tenant_tier_share of the tier is kept for it)"
PRIORITY_HELP = (
    "Class: high, normal or batch; weighs its fair share and cache keep-score "
    "(high 4, normal 1, batch 0.25)"
)
# NOTE: a str, parsed by ``priority_class``: typer's own refusal of an enum value read "Value
# error, 'urgent' is not one of ..." (pydantic's prefix), unlike every other refusal here
Priority = Annotated[str, typer.Option(help=PRIORITY_HELP)]


def priority_class(value: str) -> PriorityClass:
    """``--priority``'s value; a ValueError naming the flag and the classes otherwise."""
    try:
        return PriorityClass(value)
    except ValueError:
        expected = ", ".join(c.value for c in PriorityClass)
        raise ValueError(f"--priority {value!r} is invalid; expected one of {expected}") from None


MaxGpuBytes = Annotated[
    int | None,
    typer.Option(
        help=f"Bytes of its adapters in GPU slots {_SHARE}. Every adapter takes a whole "
        "max-rank slot; below one slot (0 too) no adapter of the tenant loads: the admin API "
        "refuses such a cap, this command cannot (the slot's size is the server's), and the "
        "server then answers each adapter request with a 422 tenant_cap_too_small naming the cap"
    ),
]
MaxCpuBytes = Annotated[
    int | None, typer.Option(help=f"Bytes of its adapters in host memory {_SHARE}")
]
MaxDiskBytes = Annotated[int | None, typer.Option(help=f"Bytes of its adapters on disk {_SHARE}")]
MaxColdLoads = Annotated[
    int | None, typer.Option(help="Its adapter loads in flight at most (default: no cap)")
]
MaxRequestsPerS = Annotated[
    float | None, typer.Option(help="Requests per second (token bucket) (default: no cap)")
]


def register(app: typer.Typer) -> None:
    adapters = command_group(app, "adapters", "Adapter artifacts and revisions.")
    adapters.command("register")(located(register_adapter))
    adapters.command("register-many")(located(register_many))
    adapters.command("list")(located(list_adapters))
    adapters.command("show")(located(show_adapter))
    tenants = command_group(app, "tenants", "Tenants and their limits.")
    tenants.command("create")(located(create_tenant))
    tenants.command("list")(located(list_tenants))


def register_adapter(
    location: Location,
    adapter_dir: Annotated[Path, typer.Argument(help="PEFT adapter directory")],
    *,
    tenant: Annotated[str, typer.Option(help="Owning tenant")],
    name: Annotated[str, typer.Option(help="Adapter name")],
    revision: Annotated[str, typer.Option(help="Revision label (immutable)")],
    base_model: BaseModelDir,
    max_lora_rank: MaxLoraRank = 64,
    state: Annotated[
        RevisionState, typer.Option(help="Initial state", parser=choice_of(RevisionState))
    ] = RevisionState.STABLE,
    warm_policy: Annotated[
        WarmPolicy, typer.Option(parser=choice_of(WarmPolicy))
    ] = WarmPolicy.ON_DEMAND,
    probe_prompt: Annotated[str | None, typer.Option(help="Output-probe prompt")] = None,
    expected_continuation: Annotated[str | None, typer.Option()] = None,
    public: Annotated[bool, typer.Option(help="Share a new adapter with all tenants")] = False,
    actor: Actor = None,
) -> None:
    """Validate an adapter against the base model, store its files and record the revision."""
    with failures():
        request = RegistrationRequest(
            adapter_dir=adapter_dir,
            tenant=tenant,
            name=name,
            revision=revision,
            state=state,
            warm_policy=warm_policy,
            probe_prompt=probe_prompt,
            expected_continuation=expected_continuation,
            visibility=Visibility.PUBLIC if public else Visibility.PRIVATE,
        )
        config = location.config(max_lora_rank)
        with opened(config, BaseModelSpec.from_dir(base_model), create=True) as registry:
            result = registry.register(request, acting(actor))
        rev = result.revision
        verb = "registered" if result.created else "already registered (identical bytes)"
        typer.echo(f"{verb} {rev.ref} sha256={rev.adapter_digest} rank={rev.max_rank}")
        for warning in result.warnings:
            typer.echo(f"warning: {warning}", err=True)
    if result.created and warm_policy is not WarmPolicy.ON_DEMAND:
        # NOTE: the registry row alone does not reach a running server's cache (it reads warm
        # policies at start); said here, as `tenants update` says it, so no one waits for it.
        typer.echo(
            f"note: a running server applies --warm-policy {warm_policy.value} at its next start, "
            f"or now with PUT /admin/revisions/{tenant}/{name}/{revision} "
            f'{{"warm_policy": "{warm_policy.value}"}}',
            err=True,
        )


def register_many(
    location: Location,
    source: Annotated[
        Path,
        typer.Argument(help="A tree ROOT/<tenant>/<name>/<revision>/ or a JSONL manifest file"),
    ],
    *,
    base_model: BaseModelDir,
    max_lora_rank: MaxLoraRank = 64,
    state: Annotated[
        RevisionState,
        typer.Option(
            help="Initial state (tree; a manifest line may set it)",
            parser=choice_of(RevisionState),
        ),
    ] = RevisionState.STABLE,
    warm_policy: Annotated[
        WarmPolicy, typer.Option(parser=choice_of(WarmPolicy))
    ] = WarmPolicy.ON_DEMAND,
    public: Annotated[
        bool, typer.Option(help="Share new adapters (tree) with all tenants")
    ] = False,
    actor: Actor = None,
) -> None:
    """Register every adapter of a directory tree or a JSONL manifest, in one process. A bad item
    is reported with its error and changes nothing; exit status 1 if any item failed."""
    from loraplex.registry.bulk import manifest_items, register_all, tree_items

    with failures():
        if source.is_dir():
            visibility = Visibility.PUBLIC if public else Visibility.PRIVATE
            items = tree_items(source, state=state, warm_policy=warm_policy, visibility=visibility)
        elif source.is_file():
            items = manifest_items(source)
        else:
            raise ValueError(f"{source} does not exist; expected a directory tree or a manifest")
        base = BaseModelSpec.from_dir(base_model)
        with opened(location.config(max_lora_rank), base, create=True) as registry:
            report = register_all(registry, items, acting(actor))
    for result in (*report.created, *report.unchanged):
        for warning in result.warnings:
            typer.echo(f"warning: {result.revision.ref}: {warning}", err=True)
    for failure in report.failed:
        typer.echo(f"failed {failure.source}: {failure.error}", err=True)
    typer.echo(
        f"{len(report.created)} registered, {len(report.unchanged)} already registered, "
        f"{len(report.failed)} failed"
    )
    if report.failed:
        raise typer.Exit(1)


def list_adapters(
    location: Location,
    tenant: Annotated[
        str | None,
        typer.Option(
            help="Only what this tenant may call by name: its own and public adapters whose "
            "alias serves a revision (default: every adapter)"
        ),
    ] = None,
    *,
    limit: Limit = DEFAULT_PAGE,
    after: After = None,
) -> None:
    """List adapters with their alias targets, by tenant and name: one page, and on stderr the
    --after (tenant/name) of the next one when more follow, or that there is none (stdout stays
    empty). A --tenant that names no tenant
    exits 1 naming it, as ``keys list`` and ``release list`` do (it listed the public adapters,
    as if the tenant existed)."""
    with failures(), opened(location.config()) as registry:
        if tenant is not None:
            require_tenant(registry, tenant)
        found, next_after = one_page(
            lambda page: (
                registry.list_adapters(None, page)
                if tenant is None
                else registry.usable_adapters(tenant, page)
            ),
            lambda adapter: adapter.ref,
            after,
            limit,
        )
        for adapter in found:
            alias = registry.get_alias(adapter.tenant, adapter.name)
            split = "" if alias is None else targets_text(alias.targets)
            typer.echo(f"{adapter.ref}\t{adapter.visibility.value}\t{split}")
    if not found:
        none_listed("adapter", None if tenant is None else f"usable by tenant {tenant!r}", after)
    next_page("adapters", next_after)


def show_adapter(
    location: Location,
    ref: Annotated[str, typer.Argument(help="tenant/name")],
) -> None:
    """Show an adapter, its alias and every revision."""
    with failures(), opened(location.config()) as registry:
        tenant, _, name = ref.partition("/")
        adapter = registry.get_adapter(tenant, name)
        alias = registry.get_alias(tenant, name)
        typer.echo(f"adapter     {adapter.ref} ({adapter.visibility.value})")
        if alias is not None:
            typer.echo(f"alias       {targets_text(alias.targets)}")
            typer.echo(f"rollback    {targets_text(alias.rollback_targets) or '-'}")
        for rev in listed(
            lambda page: registry.list_revisions(tenant, name, page), lambda rev: rev.revision
        ):
            typer.echo(
                f"revision    {rev.revision}\t{rev.state.value}\twarm={rev.warm_policy.value}"
                f"\trank={rev.max_rank}\talpha={rev.lora_alpha:g}\trslora={rev.use_rslora}"
                f"\tdtype={rev.dtype}\tbytes={rev.estimated_bytes}"
                f"\tmodules={','.join(rev.target_modules)}\tcreated={utc_time(rev.created_at)}"
            )
            typer.echo(f"            sha256={rev.adapter_digest} base={rev.base_digest}")
            if rev.provenance is not None:
                typer.echo(provenance_line(rev.provenance))
            else:
                typer.echo("            unsigned")


def create_tenant(
    location: Location,
    name: Annotated[str, typer.Argument()],
    *,
    priority: Priority = PriorityClass.NORMAL.value,
    max_gpu_bytes: MaxGpuBytes = None,
    max_cpu_bytes: MaxCpuBytes = None,
    max_disk_bytes: MaxDiskBytes = None,
    max_cold_loads: MaxColdLoads = None,
    max_requests_per_s: MaxRequestsPerS = None,
    max_running_seqs: Annotated[int | None, typer.Option(help=MAX_RUNNING_SEQS_HELP)] = None,
    reserved_running_seqs: Annotated[int, typer.Option(help=RESERVED_SEQS_HELP)] = 0,
    max_kv_blocks: Annotated[int | None, typer.Option(help=MAX_KV_BLOCKS_HELP)] = None,
    actor: Actor = None,
) -> None:
    """Create a tenant (quotas default to unlimited, seats to a fair share)."""
    with failures():
        priority_of = priority_class(priority)  # refused before a registry is opened or made
        quotas = TenantQuotas(
            max_gpu_bytes,
            max_cpu_bytes,
            max_disk_bytes,
            max_cold_loads,
            max_requests_per_s,
            max_running_seqs,
            reserved_running_seqs,
            max_kv_blocks,
        )
        with opened(location.config(), create=True) as registry:
            tenant = registry.create_tenant(name, acting(actor), priority_of, quotas)
        typer.echo(f"created tenant {tenant.name} ({tenant.priority.value})")
    given = {k for k, v in vars(quotas).items() if v != getattr(TenantQuotas(), k)}
    note_for_a_running_server(name, priority_of is not PriorityClass.NORMAL, given)


def note_for_a_running_server(tenant: str, priority: bool, quotas: set[str]) -> None:
    """Say on stderr which of a tenant's settings a running server does not take from this write.
    NOTE: the rate limit is read with the key on every request; the rest lives in the engine's
    cache and scheduler, which only the admin API or a start refreshes (a tenant created here
    with --max-gpu-bytes was served from the GPU by a running server as if it had no cap)."""
    if priority or quotas - {"max_requests_per_s"}:
        typer.echo(
            "note: a running server takes max_requests_per_s at once, the priority and the other "
            f"limits at its next start, or now with PUT /admin/tenants/{tenant}",
            err=True,
        )


def list_tenants(
    location: Location,
    *,
    limit: Limit = DEFAULT_PAGE,
    after: After = None,
) -> None:
    """List tenants and their limits, by name: one page, and on stderr the --after of the next
    one when more follow, or that there is none (stdout stays empty)."""
    with failures(), opened(location.config()) as registry:
        tenants, next_after = one_page(
            registry.list_tenants, lambda tenant: tenant.name, after, limit
        )
    for tenant in tenants:
        typer.echo(limits_line(tenant))
    if not tenants:
        none_listed("tenant", after=after)
    next_page("tenants", next_after)


def limits_line(tenant: Tenant) -> str:
    """One tenant's class and limits, tab-separated (``tenants list`` and ``update``)."""
    q = tenant.quotas
    return (
        f"{tenant.name}\t{tenant.priority.value}\tgpu_bytes={q.max_gpu_bytes}"
        f"\tcpu_bytes={q.max_cpu_bytes}\tdisk_bytes={q.max_disk_bytes}"
        f"\tcold_loads={q.max_cold_loads}\trequests_per_s={q.max_requests_per_s}"
        f"\trunning_seqs={q.max_running_seqs}\treserved_seqs={q.reserved_running_seqs}"
        f"\tkv_blocks={q.max_kv_blocks}"
    )
