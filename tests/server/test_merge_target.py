"""``mode = "merged:<ref>"`` naming no registered revision is said at start, naming ``mode``: it
was served unmerged in silence, a mistyped revision merging nothing."""

from __future__ import annotations

import logging

import pytest
from conftest import Served

from loraplex.serve.merge_target import warn_if_unregistered


@pytest.mark.parametrize("ref", ["acme/suport@r1", "acme/support@r9", "nobody/support@r1"])
def test_a_merge_target_the_registry_lacks_is_warned_about(
    served: Served, caplog: pytest.LogCaptureFixture, ref: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="loraplex"):
        assert warn_if_unregistered(f"merged:{ref}", served.registry)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert f"mode merged:{ref}: no revision {ref} is registered" in record.getMessage()


@pytest.mark.parametrize("mode", ["merged:acme/support@r1", "unmerged", "auto"])
def test_a_registered_target_or_no_target_says_nothing(
    served: Served, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="loraplex"):
        assert not warn_if_unregistered(mode, served.registry)
    assert caplog.records == []
