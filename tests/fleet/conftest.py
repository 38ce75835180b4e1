"""The fleet tests' shared fixtures over fake deployment calls (``fleet_fakes.FakeCalls``): the
board, a ``FleetLink`` that has read it, a ``FleetCache`` over that link. A file whose board
differs defines its own ``calls``; ``link`` and ``cache`` then read that one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fleet_fakes import FakeCalls, entry, polled_twice, started_link

from loraplex.fleet.cache import FleetCache
from loraplex.fleet.link import FleetLink


@pytest.fixture
def calls() -> FakeCalls:
    """Two healthy replicas on the board, ``a`` and ``b``."""
    return FakeCalls(board=[entry("a"), entry("b")])


@pytest.fixture
def link(calls: FakeCalls) -> Iterator[FleetLink]:
    built = started_link(calls)
    yield built
    built.close()


@pytest.fixture
def cache(link: FleetLink, calls: FakeCalls) -> FleetCache:
    built = FleetCache(link)
    polled_twice(link)  # the replicas on the board are known: nothing is replayed to them
    calls.calls.clear()
    return built
