"""What the registry commands share: the registry opened at a command's location (an existing
one only, unless the command creates it), failures reported as one line and exit status 1, who
is acting, the command groups several modules add to, and the formats they print.
"""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import is_name
from loraplex.cli.locations import unusable_path
from loraplex.errors import InvalidRequestError, LoraplexError, RecordNotFoundError, nearest
from loraplex.registry import AliasTarget, Provenance, Registry, RegistryConfig, open_registry
from loraplex.registry.sql.paging import MAX_PAGE, Page, every_row

Actor = Annotated[str | None, typer.Option(help="Who is acting, for the audit log")]
LIST_PAGE = MAX_PAGE  # rows a ``list`` command reads per registry call (one short transaction)
T = TypeVar("T")
Limit = Annotated[int, typer.Option(help=f"Rows printed at most, 1 to {MAX_PAGE}.")]
After = Annotated[
    str | None, typer.Option(help="Start after this id (the last one the previous page printed).")
]


def command_group(app: typer.Typer, name: str, help_text: str) -> typer.Typer:
    """The ``name`` command group, shared with other modules that add commands to it."""
    for info in app.registered_groups:
        if info.name == name and info.typer_instance is not None:
            return info.typer_instance
    group = typer.Typer(help=help_text, no_args_is_help=True)
    app.add_typer(group, name=name)
    return group


def listed(read: Callable[[Page], Sequence[T]], cursor: Callable[[T], str]) -> Iterator[T]:
    """Every row of a registry listing, ``LIST_PAGE`` rows per read, as they are used (``adapters
    show``'s revisions): never more than a page in memory or one transaction for all of it."""
    return every_row(read, cursor, LIST_PAGE)


def tenant_hint(registry: Registry, name: str) -> str:
    """What to do about a tenant ``name`` that does not exist: the nearest one's name, if any
    is near, and how to create it."""
    names = (t.name for t in listed(registry.list_tenants, lambda t: t.name))
    near = nearest(name, names)
    hint = "" if near is None else f"; did you mean {near}?"
    if is_name(name):
        hint += f" (`loraplex tenants create {name}` creates it)"
    return hint


def require_tenant(registry: Registry, name: str) -> None:
    """Nothing when tenant ``name`` exists, else its ``RecordNotFoundError`` with
    ``tenant_hint``: a ``--tenant`` that names no tenant is refused, not read as one with
    nothing to list."""
    try:
        registry.get_tenant(name)
    except RecordNotFoundError as exc:
        raise RecordNotFoundError(f"{exc}{tenant_hint(registry, name)}") from None


def one_page(
    read: Callable[[Page], Sequence[T]], cursor: Callable[[T], str], after: str | None, limit: int
) -> tuple[list[T], str | None]:
    """At most ``limit`` rows of a registry listing after the row ``after`` names (``--limit``,
    ``--after``), as the admin API pages it, and the ``--after`` of the next page (None: no row
    follows; a full page is followed by a one-row read). A value the listing refuses is refused
    naming its flag. What every ``list`` command prints (``next_page``: the line after it)."""
    try:
        page = Page(after, limit)
        rows = list(read(page))
    except InvalidRequestError as exc:
        if exc.param not in ("after", "limit"):
            raise
        raise typer.BadParameter(str(exc), param_hint=f"--{exc.param}") from None
    more = len(rows) == limit and bool(read(Page(cursor(rows[-1]), 1)))
    return rows, cursor(rows[-1]) if more else None


def next_page(what: str, after: str | None) -> None:
    """On stderr, after a page that more rows follow (``after``: ``one_page``'s), how to get
    them; nothing after the last page."""
    if after is not None:
        typer.echo(f"more {what} follow: the next page is --after {after}", err=True)


def none_listed(
    what: str, scope: str | None = None, after: str | None = None, hint: str | None = None
) -> None:
    """On stderr, after an empty page, that there is none: ``no key of tenant 'acme' after k1``
    (``scope``: what the listing was narrowed to; ``hint``: how to list more). stdout stays
    empty for scripts and the exit code 0; every ``list`` command printed nothing at all, which
    read as a command that failed."""
    said = f"no {what}"
    if scope is not None:
        said += f" {scope}"
    if after is not None:
        said += f" after {after}"
    typer.echo(said if hint is None else f"{said} ({hint})", err=True)


@contextlib.contextmanager
def opened(
    config: RegistryConfig, base: BaseModelSpec | None = None, *, create: bool = False
) -> Iterator[Registry]:
    """The registry; a SQLite one that does not exist yet is created only with ``create`` (the
    commands that register adapters or tenants): any other command on a mistyped ``--data-dir``
    would otherwise answer from a new, empty registry (and leave it behind)."""
    if not create:
        require_existing(config)
    registry = open_registry(config, base)
    try:
        yield registry
    finally:
        registry.close()


SQLITE_PREFIX = "sqlite:///"  # registry/sql/connect.py: the path follows


def require_existing(config: RegistryConfig) -> None:
    if config.database_url is None and config.data_dir.exists() and not config.data_dir.is_dir():
        # as a creating command says it (it said "no registry at FILE/registry.sqlite3")
        raise ValueError(f"cannot use {config.data_dir}: it is not a directory")
    database = config.database
    if not database.startswith(SQLITE_PREFIX) or database == f"{SQLITE_PREFIX}:memory:":
        return  # a server database: opening it creates nothing
    path = Path(database.removeprefix(SQLITE_PREFIX))
    if not path.is_file():
        where = "data_dir" if config.database_url is None else "database_url"
        raise ValueError(
            f"{where}: no registry at {path}; check --data-dir / LORAPLEX_DATA_DIR (or "
            "--database-url): `loraplex serve`, `adapters register` or `tenants create` "
            "creates one"
        )


@contextlib.contextmanager
def failures() -> Iterator[None]:
    """Domain errors, invalid values and an unusable data directory become one line on stderr
    and exit status 1."""
    try:
        yield
    except (LoraplexError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except BrokenPipeError:
        # The reader left (`release status | head -1`): no path is unusable, and click exits
        # quietly on it (it printed "error: Broken pipe" here).
        raise
    except OSError as exc:  # e.g. --data-dir names a file, or a directory this user cannot write
        typer.echo(f"error: {unusable_path(exc)}", err=True)
        raise typer.Exit(1) from exc


def acting(actor: str | None) -> str:
    """``--actor``, or ``cli:<login name>`` when it is not given (the audit row's actor)."""
    return actor or f"cli:{getpass.getuser()}"


def targets_text(targets: tuple[AliasTarget, ...]) -> str:
    return " ".join(f"{t.revision}:{t.weight}" for t in targets)


def provenance_line(p: Provenance) -> str:
    """A signed revision's provenance, as ``adapters show`` and ``adapters verify`` print it."""
    return (
        f"            signed by {p.signer} (anchor {p.trust_anchor}) "
        f"verified={utc_time(p.verified_at)} manifest={p.manifest_digest} "
        f"bundle={p.signature_digest}"
    )


def utc_time(epoch_s: float) -> str:
    """``epoch_s`` as a UTC date; one no date can show (infinite, past year 9999: a release
    stored before its plan's bounds, ``release/shown.py``) as ``no date (VALUE)``. NOTE: it
    raised ``OverflowError``, which ended ``release status`` with a traceback."""
    try:
        return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return f"no date ({epoch_s!r})"
