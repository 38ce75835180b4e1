"""``Page``: one bounded page of a listing (releases, adapters, keys, tenants, revisions,
``/v1/models``), read by keyset; ``every_row``: a whole listing read one page at a time.

NOTE: a listing reads at most ``limit`` rows in SQL (``LIMIT ?``), never all of them and then a
slice; the next page starts after the last row seen (``after``, its id), so a page costs the same
however many rows came before it, and a row inserted meanwhile shifts nothing. A cursor
condition leads with ``column >= ?`` so both databases read it as a range of the listing's index
(with ``a > ? OR (a = ? AND ...)`` alone, a page deep in 50,000 releases took 3.5x (SQLite) and
4.5x (PostgreSQL) the first page's time).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from loraplex.artifacts.identity import MAX_NAME_CHARS, is_name
from loraplex.errors import InvalidRequestError, quoted
from loraplex.registry.sql.db import Row, Tx

MAX_PAGE = 1000  # rows one page returns at most
DEFAULT_PAGE = 100  # rows a page returns when the caller names no limit
# the longest ``after`` cursor read: ``tenant/name`` of two names of the longest
# NOTE: it was 256, one short of that, so a page ending on such an adapter had no next page
MAX_CURSOR_CHARS = 2 * MAX_NAME_CHARS + 1

T = TypeVar("T")


@dataclass(frozen=True)
class Page:
    """Which rows of an ordered listing to read."""

    after: str | None = None  # the id of the last row of the previous page; None: from the start
    limit: int = DEFAULT_PAGE  # rows to read at most, 1 to MAX_PAGE

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_PAGE:
            raise InvalidRequestError(
                f"limit {quoted(self.limit)} is invalid; expected 1 to {MAX_PAGE}", "limit"
            )
        if self.after is not None and not 1 <= len(self.after) <= MAX_CURSOR_CHARS:
            raise InvalidRequestError(
                f"after {quoted(self.after)} is invalid; expected 1 to {MAX_CURSOR_CHARS} "
                "characters",
                "after",
            )

    def params(self) -> dict[str, Any]:
        """The query parameters that ask an HTTP listing for this page."""
        return {"limit": self.limit} | ({} if self.after is None else {"after": self.after})


def unknown_cursor(after: str, what: str) -> InvalidRequestError:
    """The 400 for an ``after`` that names no row (a typo, or a cursor from another listing)."""
    return InvalidRequestError(f"after {quoted(after)} is not the id of any {what}", "after")


def position_names(after: str, num_names: int) -> list[str]:
    """The ``num_names`` names of a positional cursor (a tenant's name, or ``tenant/name``): it
    need not name a row (the order is the key's), but it must be a key a row could have.
    NOTE: any string was a position: ``?after=%FF`` (decoded as U+FFFD, after every name) was
    an empty last page and a typo like ``acme:bot`` a page from somewhere, not the 400."""
    names = after.split("/")
    if len(names) != num_names or not all(is_name(name) for name in names):
        expected = "a tenant name" if num_names == 1 else "tenant/name"
        raise InvalidRequestError(
            f"after {quoted(after)} is invalid; expected {expected} (each 1-{MAX_NAME_CHARS} "
            "characters of [A-Za-z0-9._-] starting with a letter or digit)",
            "after",
        )
    return names


def select(
    tx: Tx,
    columns_from: str,
    *,
    where: Sequence[str],
    params: Sequence[object],
    order_by: str,
    page: Page | None,
) -> list[Row]:
    """``SELECT columns_from`` where every condition of ``where`` holds (``params`` in order),
    ordered by ``order_by``; with ``page``, at most ``page.limit`` rows, read by the database."""
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    limit, bound = ("", []) if page is None else (" LIMIT ?", [page.limit])
    return tx.query(f"SELECT {columns_from}{clause} ORDER BY {order_by}{limit}", [*params, *bound])


def every_row(
    read: Callable[[Page], Sequence[T]], cursor: Callable[[T], str], size: int = MAX_PAGE
) -> Iterator[T]:
    """Every row of a paged listing, read ``size`` rows at a time as they are used: ``read``
    reads one page (from the database or over HTTP), ``cursor`` gives a row's ``after``. A page
    of any other length than asked for is the last (a listing that does not page answers
    everything at once). A full page that ends on the row it was asked to start after is an
    error, not a loop: the listing does not page by ``after`` (an older server answering its
    first page again), so reading on would never end."""
    page = Page(None, size)
    while True:
        rows = read(page)
        if page.after is not None and rows and cursor(rows[-1]) == page.after:
            raise ValueError(
                f"the listing answered the page after {page.after!r} with that row again; "
                "it does not page by after (an older server?)"
            )
        yield from rows
        if len(rows) != page.limit:
            return
        page = Page(cursor(rows[-1]), size)
