"""A nonexistent adapter and another tenant's private one take the same path (issue 11, item 11).

Timing cannot tell them apart when both run the same statements and the same lines of loraplex
before the same error: the test records both, structurally, instead of timing them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from registry_kit import AdapterFactory

import loraplex
from loraplex.errors import AdapterNotFoundError
from loraplex.registry import RegistrationRequest, Registry

PACKAGE = str(Path(loraplex.__file__).parent)
_SQL_CALLS = {"execute", "query", "query_one"}


def _trace(registry: Registry, caller: str, text: str) -> tuple[list[object], str]:
    """Every line of loraplex run while resolving ``text`` (and each SQL statement with its
    parameters), and the error raised."""
    events: list[object] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE):
            return None
        if event == "call" and code.co_name in _SQL_CALLS and "sql" in frame.f_locals:
            events.append(("sql", frame.f_locals["sql"], tuple(frame.f_locals["params"])))
        elif event == "line":
            events.append((code.co_filename, frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        registry.resolve_revision(caller, text, request_id="probe")
    except AdapterNotFoundError as exc:
        return events, str(exc)
    finally:
        sys.settrace(None)
    raise AssertionError(f"{text} resolved for {caller}")


@pytest.mark.parametrize("text", ["acme/secret", "acme/secret@v1"])
def test_missing_and_private_adapters_run_the_same_path(
    registry: Registry, make_adapter: AdapterFactory, text: str
) -> None:
    for tenant in ("acme", "beta"):
        registry.create_tenant(tenant, "ops")
    missing = _trace(registry, "beta", text)
    registry.register(RegistrationRequest(make_adapter("s"), "acme", "secret", "v1"), "ops")

    private = _trace(registry, "beta", text)

    assert private == missing
    assert any(event[0] == "sql" for event in missing[0])
    assert registry.resolve("acme", text.removeprefix("acme/")).name == "secret"
