"""Pages of the listings (releases, adapters, keys, tenants, revisions, what a tenant may use)
on SQLite and PostgreSQL: a page ends at its limit, the next one starts after the cursor with
nothing skipped or repeated (rows with equal timestamps too), and a cursor that names no row is
refused naming ``after``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
from registry_kit import AdapterFactory, OpenRegistry

from loraplex.artifacts.identity import MAX_NAME_CHARS
from loraplex.errors import InvalidRequestError, RecordNotFoundError
from loraplex.registry import RegistrationRequest, Registry, Visibility
from loraplex.registry.sql.paging import MAX_CURSOR_CHARS, MAX_PAGE, Page, every_row
from loraplex.release.model import ReleasePlan
from loraplex.release.store import ReleaseStore

T = TypeVar("T")


def _all_pages(read: Callable[[Page], list[T]], cursor: Callable[[T], str], limit: int) -> list[T]:
    rows: list[T] = []
    page = read(Page(None, limit))
    while page:
        assert len(page) <= limit
        rows += page
        page = read(Page(cursor(page[-1]), limit))
    return rows


@pytest.fixture(params=["ticking", "frozen"])
def reg(request: pytest.FixtureRequest, open_reg: OpenRegistry) -> Registry:
    """``frozen``: every row gets the same timestamp, so only the id orders them."""
    if request.param == "frozen":
        return open_reg(wall_clock=lambda: 1_700_000_000.0)
    return open_reg()


@pytest.fixture
def finished_releases(reg: Registry, make_adapter: AdapterFactory) -> ReleaseStore:
    """acme/bot: five aborted releases of v2, then one staged (in flight)."""
    reg.create_tenant("acme", "ops")
    for seed, revision in enumerate(("v1", "v2")):
        reg.register(
            RegistrationRequest(make_adapter(revision, seed=seed), "acme", "bot", revision), "ops"
        )
    store = ReleaseStore(reg)
    for _ in range(5):
        store.start_release("acme", "bot", "v2", ReleasePlan(), actor="ops")
        store.abort("acme", "bot", actor="ops")
    store.start_release("acme", "bot", "v2", ReleasePlan(), actor="ops")
    return store


def test_releases_page_through_every_release_once(
    reg: Registry, finished_releases: ReleaseStore
) -> None:
    store = finished_releases
    everything = store.list_releases(include_terminal=True)
    assert len(everything) == 6

    def read(page: Page) -> list:  # type: ignore[type-arg]
        return store.list_releases(include_terminal=True, page=page)

    for limit in (1, 2, 4, 6, MAX_PAGE):
        paged = _all_pages(read, lambda r: r.release_id, limit)
        assert [r.release_id for r in paged] == [r.release_id for r in everything], limit
    first = read(Page(None, 4))
    assert len(first) == 4  # the boundary: exactly the limit, the rest on the next page
    assert [r.release_id for r in read(Page(first[-1].release_id, 4))] == [
        r.release_id for r in everything[4:]
    ]
    # in flight only: a finished release still works as the cursor
    in_flight = store.list_releases(page=Page(everything[0].release_id, 10))
    assert in_flight == [r for r in everything[1:] if not r.terminal]
    reg.create_tenant("other", "ops")
    assert store.list_releases(tenant="other", page=Page(None, 10)) == []
    with pytest.raises(RecordNotFoundError, match="tenant 'nobody' does not exist"):
        store.list_releases(tenant="nobody", page=Page(None, 10))  # not an empty page


def test_a_release_cursor_that_names_no_release_is_refused(
    finished_releases: ReleaseStore,
) -> None:
    with pytest.raises(InvalidRequestError, match="after 'rel-nope'") as caught:
        finished_releases.list_releases(include_terminal=True, page=Page("rel-nope", 10))
    assert caught.value.param == "after"


def test_adapters_and_keys_page_through(reg: Registry, make_adapter: AdapterFactory) -> None:
    for tenant in ("acme", "beta", "zeta"):
        reg.create_tenant(tenant, "ops")
        for n in range(3):
            adapter = make_adapter(f"{tenant}{n}", seed=n)
            reg.register(RegistrationRequest(adapter, tenant, f"bot{n}", "v1"), "ops")
            reg.create_key(tenant, "ops")
    adapters = reg.list_adapters()
    keys = reg.list_keys()
    assert len(adapters) == len(keys) == 9
    for limit in (1, 2, 9, MAX_PAGE):
        paged = _all_pages(
            lambda page: reg.list_adapters(None, page), lambda a: f"{a.tenant}/{a.name}", limit
        )
        assert paged == adapters
        assert _all_pages(lambda page: reg.list_keys(None, page), lambda k: k.key_id, limit) == keys
    beta = _all_pages(lambda page: reg.list_keys("beta", page), lambda k: k.key_id, 2)
    assert beta == [k for k in keys if k.tenant == "beta"]
    assert reg.list_adapters("beta", Page("acme/zzz", 2)) == reg.list_adapters("beta")[:2]
    with pytest.raises(InvalidRequestError) as caught:
        reg.list_keys(None, Page("key-nope", 10))
    assert caught.value.param == "after"
    # a cursor naming another tenant's key, in a listing filtered to one tenant: refused, as
    # one naming no key (it was an empty page, or the whole listing, by where it sorted)
    for cursor in (keys[0].key_id, keys[-1].key_id):
        with pytest.raises(InvalidRequestError, match="not the id of any key of tenant 'beta'"):
            reg.list_keys("beta", Page(cursor, 10))
    with pytest.raises(InvalidRequestError) as caught:
        reg.list_adapters(None, Page("no-slash", 10))
    assert caught.value.param == "after"


@pytest.mark.parametrize(
    ("after", "limit", "param"),
    [
        (None, 0, "limit"),
        (None, -1, "limit"),  # SQLite's LIMIT -1 reads everything
        (None, MAX_PAGE + 1, "limit"),
        ("", 10, "after"),
        ("x" * (MAX_CURSOR_CHARS + 1), 10, "after"),
    ],
)
def test_a_page_is_bounded(after: str | None, limit: int, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Page(after, limit)
    assert caught.value.param == param


def test_tenants_and_revisions_page_through(reg: Registry, make_adapter: AdapterFactory) -> None:
    for tenant in ("zeta", "acme", "beta", "mid"):
        reg.create_tenant(tenant, "ops")
    for n, revision in enumerate(("v3", "v1", "v2", "v10")):  # registration order, not names
        reg.register(
            RegistrationRequest(make_adapter(revision, seed=n), "acme", "bot", revision), "ops"
        )
    tenants = reg.list_tenants()
    assert [t.name for t in tenants] == ["acme", "beta", "mid", "zeta"]
    revisions = reg.list_revisions("acme", "bot")
    assert len(revisions) == 4
    for limit in (1, 3, 4, MAX_PAGE):
        assert _all_pages(reg.list_tenants, lambda t: t.name, limit) == tenants
        paged = _all_pages(
            lambda page: reg.list_revisions("acme", "bot", page), lambda r: r.revision, limit
        )
        assert paged == revisions
    assert reg.list_tenants(Page("b", 2)) == tenants[1:3]  # a position: no such tenant needed
    with pytest.raises(
        InvalidRequestError, match="after 'v9' is not the id of any revision"
    ) as caught:
        reg.list_revisions("acme", "bot", Page("v9", 2))
    assert caught.value.param == "after"


def test_what_a_tenant_may_use_pages_through(reg: Registry, make_adapter: AdapterFactory) -> None:
    """Its own adapters and other tenants' public ones, never their private ones, in pages."""
    for n, (tenant, name, public) in enumerate(
        [("acme", "a1", False), ("acme", "a2", False), ("beta", "b1", True), ("beta", "b2", False),
         ("zeta", "z1", True), ("zeta", "z2", True)]
    ):  # fmt: skip
        if n % 2 == 0:
            reg.create_tenant(tenant, "ops")
        reg.register(RegistrationRequest(make_adapter(name, seed=n), tenant, name, "v1"), "ops")
        if public:
            reg.set_visibility(tenant, name, Visibility.PUBLIC, "ops")
    usable = reg.usable_adapters("acme")
    assert [a.ref for a in usable] == ["acme/a1", "acme/a2", "beta/b1", "zeta/z1", "zeta/z2"]
    for limit in (1, 2, 5, MAX_PAGE):
        paged = _all_pages(lambda page: reg.usable_adapters("acme", page), lambda a: a.ref, limit)
        assert paged == usable
    # a cursor naming another tenant's private adapter is only a position
    assert reg.usable_adapters("acme", Page("beta/b2", 5)) == usable[3:]


def test_the_longest_adapter_reference_is_a_cursor(
    reg: Registry, make_adapter: AdapterFactory
) -> None:
    """``tenant/name`` of two names of the longest: a page ending on it has a next page."""
    tenant, name = "t" * MAX_NAME_CHARS, "n" * MAX_NAME_CHARS
    reg.create_tenant(tenant, "ops")
    reg.register(RegistrationRequest(make_adapter("long"), tenant, name, "v1"), "ops")
    reg.register(RegistrationRequest(make_adapter("next", seed=1), tenant, "o" * 9, "v1"), "ops")
    first = reg.list_adapters(None, Page(None, 1))
    assert len(first[0].ref) == MAX_CURSOR_CHARS
    assert [a.name for a in reg.list_adapters(None, Page(first[0].ref, 1))] == ["o" * 9]


def test_every_row_follows_the_cursor_until_a_short_page() -> None:
    rows = list(range(7))
    asked: list[Page] = []

    def read(page: Page) -> list[int]:
        asked.append(page)
        start = 0 if page.after is None else int(page.after) + 1
        return rows[start : start + page.limit]

    assert list(every_row(read, str, 3)) == rows
    assert [(p.after, p.limit) for p in asked] == [(None, 3), ("2", 3), ("5", 3)]
    assert list(every_row(lambda page: rows, str, 3)) == rows  # a listing that does not page
    assert Page("x", 5).params() == {"limit": 5, "after": "x"} and Page().params() == {"limit": 100}


def test_every_row_stops_with_an_error_when_a_listing_ignores_after() -> None:
    """A full page answered again for every ``after`` (an older server that does not page) would
    be read forever: the second page ending on the cursor it was asked after is an error."""
    rows = list(range(3))
    asked: list[Page] = []

    def read(page: Page) -> list[int]:
        asked.append(page)
        return rows

    with pytest.raises(ValueError, match="does not page by after"):
        list(every_row(read, str, 3))
    assert [p.after for p in asked] == [None, "2"]
