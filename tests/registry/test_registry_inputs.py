"""Bounds on what callers hand the registry: an audit page, a revision's probe texts, an
alias's targets and weights. Each out-of-range value is refused naming its field, and changes
nothing (both databases)."""

from __future__ import annotations

from pathlib import Path

import pytest
from registry_kit import AdapterFactory

from loraplex.registry import AliasTarget, RegistrationRequest, Registry
from loraplex.registry.models import MAX_PROBE_TEXT_CHARS
from loraplex.registry.releases import MAX_ALIAS_TARGETS, MAX_ALIAS_WEIGHT
from loraplex.registry.sql.audit import MAX_AUDIT_PAGE


@pytest.mark.parametrize(
    ("after_seq", "limit", "message"),
    [
        (0, 0, "limit 0 is invalid; expected 1 to 1000"),
        # SQLite read LIMIT -1 as no limit: the whole log in one answer
        (0, -1, "limit -1 is invalid"),
        (0, MAX_AUDIT_PAGE + 1, "limit 1001 is invalid"),
        (-1, 10, "after_seq -1 is invalid"),
        # past a BIGINT: SQLite's driver raised OverflowError (a 500)
        (10**30, 10, "after_seq 1000000000000000000000000000000 is invalid"),
    ],
)
def test_an_audit_page_out_of_range_is_refused(
    registry: Registry, after_seq: int, limit: int, message: str
) -> None:
    registry.create_tenant("acme", "admin")
    with pytest.raises(ValueError, match=message):
        registry.audit_log(after_seq, limit)
    assert [e.action for e in registry.audit_log(0, 1)] == ["tenant.create"]


@pytest.mark.parametrize("field", ["probe_prompt", "expected_continuation"])
@pytest.mark.parametrize("length", [0, MAX_PROBE_TEXT_CHARS + 1])
def test_probe_texts_are_bounded(field: str, length: int) -> None:
    texts = {"probe_prompt": "hello", "expected_continuation": " world", field: "x" * length}
    with pytest.raises(ValueError, match=f"{field} of {length} characters is invalid"):
        RegistrationRequest(Path("a"), "acme", "bot", "v1", **texts)  # type: ignore[arg-type]
    texts[field] = "x" * MAX_PROBE_TEXT_CHARS
    RegistrationRequest(Path("a"), "acme", "bot", "v1", **texts)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["probe_prompt", "expected_continuation"])
def test_probe_texts_must_be_text_utf8_encodes(field: str) -> None:
    """attack27: a lone surrogate (JSON's ``"\\ud800"``, as a register-many file may hold) was
    stored, and each admin answer showing it became a 400 "Error serializing to JSON"."""
    texts = {"probe_prompt": "hello", "expected_continuation": " world", field: "a\ud800b"}
    with pytest.raises(ValueError, match=rf"{field} '\\ud800' at character 1 is invalid"):
        RegistrationRequest(Path("a"), "acme", "bot", "v1", **texts)  # type: ignore[arg-type]


def test_alias_targets_and_weights_are_bounded(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    registry.create_tenant("acme", "admin")
    registry.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "admin")
    before = registry.get_alias("acme", "bot")
    many = tuple(AliasTarget(f"v{i}", 1) for i in range(MAX_ALIAS_TARGETS + 1))
    with pytest.raises(ValueError, match=f"targets has {MAX_ALIAS_TARGETS + 1} entries"):
        registry.set_alias("acme", "bot", many, "admin")
    heavy = (AliasTarget("v1", MAX_ALIAS_WEIGHT + 1),)
    with pytest.raises(ValueError, match="weight 2147483649 of v1 is invalid"):
        registry.set_alias("acme", "bot", heavy, "admin")
    assert registry.get_alias("acme", "bot") == before
    registry.set_alias("acme", "bot", (AliasTarget("v1", MAX_ALIAS_WEIGHT),), "admin")
