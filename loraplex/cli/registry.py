"""``loraplex adapters register/list/show``, ``loraplex tenants create/list``,
``loraplex keys create/list/revoke``: the registry's administrative commands.

Every command takes the registry location: ``--data-dir`` (``LORAPLEX_DATA_DIR``),
``--database-url`` (``LORAPLEX_DATABASE_URL``), ``--store`` (``LORAPLEX_STORE``: a directory or
``s3://bucket/prefix``) and ``--s3-endpoint`` (``LORAPLEX_S3_ENDPOINT``).
"""

from __future__ import annotations

import contextlib
import getpass
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.errors import LoraplexError
from loraplex.registry import (
    AliasTarget,
    PriorityClass,
    RegistrationRequest,
    Registry,
    RegistryConfig,
    RevisionState,
    TenantQuotas,
    Visibility,
    WarmPolicy,
    default_data_dir,
    open_registry,
)

DataDir = Annotated[
    Path | None,
    typer.Option(
        envvar="LORAPLEX_DATA_DIR",
        help="Data directory [default: $XDG_DATA_HOME/loraplex or ~/.local/share/loraplex]",
    ),
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        envvar="LORAPLEX_DATABASE_URL",
        help="sqlite:///PATH or postgresql://... [default: SQLite in the data directory]",
    ),
]
Store = Annotated[
    str | None,
    typer.Option(
        envvar="LORAPLEX_STORE",
        help="Artifact store: a directory or s3://bucket/prefix [default: DATA_DIR/artifacts]",
    ),
]
S3Endpoint = Annotated[
    str | None, typer.Option(envvar="LORAPLEX_S3_ENDPOINT", help="S3-compatible endpoint URL")
]
Actor = Annotated[str | None, typer.Option(help="Who is acting, for the audit log")]


def register(app: typer.Typer) -> None:
    adapters = _group(app, "adapters", "Adapter artifacts and revisions.")
    adapters.command("register")(register_adapter)
    adapters.command("list")(list_adapters)
    adapters.command("show")(show_adapter)
    tenants = _group(app, "tenants", "Tenants and their limits.")
    tenants.command("create")(create_tenant)
    tenants.command("list")(list_tenants)
    keys = _group(app, "keys", "Tenant API keys.")
    keys.command("create")(create_key)
    keys.command("list")(list_keys)
    keys.command("revoke")(revoke_key)


def register_adapter(
    adapter_dir: Annotated[Path, typer.Argument(help="PEFT adapter directory")],
    *,
    tenant: Annotated[str, typer.Option(help="Owning tenant")],
    name: Annotated[str, typer.Option(help="Adapter name")],
    revision: Annotated[str, typer.Option(help="Revision label (immutable)")],
    base_model: Annotated[
        Path, typer.Option(envvar="LORAPLEX_BASE_MODEL", help="The served base model directory")
    ],
    max_lora_rank: Annotated[int, typer.Option(help="Largest rank accepted")] = 64,
    state: Annotated[RevisionState, typer.Option(help="Initial state")] = RevisionState.STABLE,
    warm_policy: Annotated[WarmPolicy, typer.Option()] = WarmPolicy.ON_DEMAND,
    probe_prompt: Annotated[str | None, typer.Option(help="Output-probe prompt")] = None,
    expected_continuation: Annotated[str | None, typer.Option()] = None,
    public: Annotated[bool, typer.Option(help="Share a new adapter with all tenants")] = False,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
    actor: Actor = None,
) -> None:
    """Validate an adapter against the base model, store its files and record the revision."""
    with _failures():
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
        config = _config(data_dir, database_url, store, s3_endpoint, max_lora_rank)
        with _opened(config, BaseModelSpec.from_dir(base_model)) as registry:
            result = registry.register(request, _actor(actor))
        rev = result.revision
        verb = "registered" if result.created else "already registered (identical bytes)"
        typer.echo(f"{verb} {rev.ref} sha256={rev.adapter_digest} rank={rev.max_rank}")


def list_adapters(
    tenant: Annotated[
        str | None, typer.Option(help="Only what this tenant may use [default: every adapter]")
    ] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
) -> None:
    """List adapters with their alias targets."""
    with _failures(), _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
        found = registry.list_adapters() if tenant is None else registry.usable_adapters(tenant)
        for adapter in found:
            alias = registry.get_alias(adapter.tenant, adapter.name)
            split = "" if alias is None else _split(alias.targets)
            typer.echo(f"{adapter.ref}\t{adapter.visibility.value}\t{split}")


def show_adapter(
    ref: Annotated[str, typer.Argument(help="tenant/name")],
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
) -> None:
    """Show an adapter, its alias and every revision."""
    with _failures(), _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
        tenant, _, name = ref.partition("/")
        adapter = registry.get_adapter(tenant, name)
        alias = registry.get_alias(tenant, name)
        typer.echo(f"adapter     {adapter.ref} ({adapter.visibility.value})")
        if alias is not None:
            typer.echo(f"alias       {_split(alias.targets)}")
            typer.echo(f"rollback    {_split(alias.rollback_targets) or '-'}")
        for rev in registry.list_revisions(tenant, name):
            typer.echo(
                f"revision    {rev.revision}\t{rev.state.value}\twarm={rev.warm_policy.value}"
                f"\trank={rev.max_rank}\talpha={rev.lora_alpha:g}\trslora={rev.use_rslora}"
                f"\tdtype={rev.dtype}\tbytes={rev.estimated_bytes}"
                f"\tmodules={','.join(rev.target_modules)}\tcreated={_time(rev.created_at)}"
            )
            typer.echo(f"            sha256={rev.adapter_digest} base={rev.base_digest}")


def create_tenant(
    name: Annotated[str, typer.Argument()],
    *,
    priority: Annotated[PriorityClass, typer.Option()] = PriorityClass.NORMAL,
    max_gpu_bytes: Annotated[int | None, typer.Option()] = None,
    max_cpu_bytes: Annotated[int | None, typer.Option()] = None,
    max_disk_bytes: Annotated[int | None, typer.Option()] = None,
    max_cold_loads: Annotated[int | None, typer.Option()] = None,
    max_requests_per_s: Annotated[float | None, typer.Option()] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
    actor: Actor = None,
) -> None:
    """Create a tenant (quotas default to unlimited)."""
    with _failures():
        quotas = TenantQuotas(
            max_gpu_bytes, max_cpu_bytes, max_disk_bytes, max_cold_loads, max_requests_per_s
        )
        with _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
            tenant = registry.create_tenant(name, _actor(actor), priority, quotas)
        typer.echo(f"created tenant {tenant.name} ({tenant.priority.value})")


def list_tenants(
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
) -> None:
    """List tenants and their limits."""
    with _failures(), _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
        for tenant in registry.list_tenants():
            q = tenant.quotas
            typer.echo(
                f"{tenant.name}\t{tenant.priority.value}\tgpu_bytes={q.max_gpu_bytes}"
                f"\tcpu_bytes={q.max_cpu_bytes}\tdisk_bytes={q.max_disk_bytes}"
                f"\tcold_loads={q.max_cold_loads}\trequests_per_s={q.max_requests_per_s}"
            )


def create_key(
    tenant: Annotated[str, typer.Argument()],
    *,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
    actor: Actor = None,
) -> None:
    """Create an API key. The token is printed once and cannot be shown again."""
    with _failures(), _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
        issued = registry.create_key(tenant, _actor(actor))
    typer.echo(f"key id {issued.key_id} for tenant {issued.tenant}; token (shown once):", err=True)
    typer.echo(issued.token)


def list_keys(
    tenant: Annotated[str | None, typer.Option()] = None,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
) -> None:
    """List API keys (ids and state; tokens are never stored)."""
    with _failures(), _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
        for key in registry.list_keys(tenant):
            state = "active" if key.revoked_at is None else f"revoked {_time(key.revoked_at)}"
            typer.echo(f"{key.key_id}\t{key.tenant}\tcreated {_time(key.created_at)}\t{state}")


def revoke_key(
    key_id: Annotated[str, typer.Argument()],
    *,
    data_dir: DataDir = None,
    database_url: DatabaseUrl = None,
    store: Store = None,
    s3_endpoint: S3Endpoint = None,
    actor: Actor = None,
) -> None:
    """Revoke an API key; it stops authenticating immediately."""
    with _failures(), _opened(_config(data_dir, database_url, store, s3_endpoint)) as registry:
        key = registry.revoke_key(key_id, _actor(actor))
    typer.echo(f"revoked key {key.key_id} of tenant {key.tenant}")


def _group(app: typer.Typer, name: str, help_text: str) -> typer.Typer:
    """The ``name`` command group, shared with other modules that add commands to it."""
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    group = typer.Typer(help=help_text, no_args_is_help=True)
    app.add_typer(group, name=name)
    return group


def _config(
    data_dir: Path | None,
    database_url: str | None,
    store: str | None,
    s3_endpoint: str | None,
    max_lora_rank: int = 64,
) -> RegistryConfig:
    return RegistryConfig(
        data_dir=data_dir or default_data_dir(os.environ, Path.home()),
        database_url=database_url,
        store=store,
        s3_endpoint=s3_endpoint,
        max_lora_rank=max_lora_rank,
    )


@contextlib.contextmanager
def _opened(config: RegistryConfig, base: BaseModelSpec | None = None) -> Iterator[Registry]:
    registry = open_registry(config, base)
    try:
        yield registry
    finally:
        registry.close()


@contextlib.contextmanager
def _failures() -> Iterator[None]:
    """Domain errors and invalid values become one line on stderr and exit status 1."""
    try:
        yield
    except (LoraplexError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def _actor(actor: str | None) -> str:
    return actor or f"cli:{getpass.getuser()}"


def _split(targets: tuple[AliasTarget, ...]) -> str:
    return " ".join(f"{t.revision}:{t.weight}" for t in targets)


def _time(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
