"""``Registry.ping``: the readiness probe answers while the database does, and raises after."""

from __future__ import annotations

import sqlite3

import pytest
from registry_kit import OpenRegistry

from loraplex.errors import RegistryUnavailableError


def test_ping_answers_while_open_and_raises_once_closed(open_reg: OpenRegistry) -> None:
    registry = open_reg()
    registry.ping()
    registry.close()
    with pytest.raises((sqlite3.Error, RegistryUnavailableError)):
        registry.ping()
