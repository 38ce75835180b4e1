"""Resolution: tenant access, aliases with weights, pins, deprecation, rollback (both databases)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from registry_kit import AdapterFactory, OpenRegistry, write_base_model

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.errors import AdapterNotFoundError, BaseModelMismatchError, RegistryError, quoted
from loraplex.registry import (
    AliasTarget,
    RegistrationRequest,
    Registry,
    RevisionState,
    Visibility,
)
from loraplex.registry.resolution import choose_target, parse_model_string
from loraplex.registry.sql.paging import Page


@pytest.fixture
def two_tenants(registry: Registry, make_adapter: AdapterFactory) -> Registry:
    """acme owns bot (v1, v2) and shared (public, v1); beta owns its own bot (v1)."""
    for tenant in ("acme", "beta"):
        registry.create_tenant(tenant, "ops")
    for label, tenant, name, revision, seed in (
        ("a1", "acme", "bot", "v1", 0),
        ("a2", "acme", "bot", "v2", 1),
        ("s1", "acme", "shared", "v1", 2),
        ("b1", "beta", "bot", "v1", 3),
    ):
        adapter_dir = make_adapter(label, seed=seed)
        registry.register(RegistrationRequest(adapter_dir, tenant, name, revision), "ops")
    registry.set_visibility("acme", "shared", Visibility.PUBLIC, "ops")
    return registry


def _not_found_message(registry: Registry, caller: str, text: str) -> str:
    with pytest.raises(AdapterNotFoundError) as info:
        registry.resolve(caller, text)
    return str(info.value)


def test_own_adapter_resolves_by_name_ref_and_pin(two_tenants: Registry) -> None:
    reg = two_tenants
    v1 = reg.get_revision("acme/bot@v1")
    assert reg.resolve("acme", "bot") == v1.key()
    assert reg.resolve("acme", "acme/bot") == v1.key()
    pinned = reg.resolve("acme", "bot@v2")
    assert (pinned.tenant, pinned.name, pinned.revision) == ("acme", "bot", "v2")
    assert pinned.adapter_digest == reg.get_revision("acme/bot@v2").adapter_digest
    assert reg.resolve("beta", "bot").tenant == "beta"


def test_an_unknown_revision_of_ones_own_adapter_is_named(two_tenants: Registry) -> None:
    """The owner is told which part of its model string is wrong (it got the same message as
    for an adapter that does not exist); another tenant still gets that uniform message."""
    message = _not_found_message(two_tenants, "acme", "bot@v9")
    assert message == "model 'bot@v9': your adapter 'bot' has no revision 'v9'"
    assert _not_found_message(two_tenants, "acme", "acme/bot@v9").endswith("no revision 'v9'")
    assert "no revision" not in _not_found_message(two_tenants, "beta", "acme/shared@v9")


def test_other_tenants_private_adapter_looks_nonexistent(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    registry.create_tenant("acme", "ops")
    registry.create_tenant("beta", "ops")
    probes = ("acme/secret", "acme/secret@v1")
    before = {text: _not_found_message(registry, "beta", text) for text in probes}
    registry.register(RegistrationRequest(make_adapter("s"), "acme", "secret", "v1"), "ops")

    after = {text: _not_found_message(registry, "beta", text) for text in probes}

    assert after == before
    assert registry.resolve("acme", "secret").name == "secret"
    assert all("secret" in message for message in after.values())


def test_public_adapter_is_usable_by_other_tenants(two_tenants: Registry) -> None:
    reg = two_tenants
    assert reg.resolve("beta", "acme/shared").tenant == "acme"
    assert reg.resolve("beta", "acme/shared@v1").revision == "v1"
    with pytest.raises(AdapterNotFoundError):
        reg.resolve("beta", "shared")  # a bare name is always the caller's own


def test_another_tenant_pins_only_what_a_public_alias_serves(
    two_tenants: Registry, make_adapter: AdapterFactory
) -> None:
    """Every revision's cache copies are charged to its owner: a tenant pinning each revision of
    another's public adapter filled the owner's share of the GPU slots and evicted the owner's
    own adapters (scripts/attacks/public-revision-flush). Others reach what the alias serves."""
    reg = two_tenants
    reg.register(RegistrationRequest(make_adapter("s2", seed=5), "acme", "shared", "v2"), "ops")
    unknown = _not_found_message(reg, "beta", "acme/shared@nosuch")
    assert _not_found_message(reg, "beta", "acme/shared@v2") == unknown.replace("nosuch", "v2")
    assert reg.resolve("acme", "acme/shared@v2").revision == "v2"  # the owner pins any
    reg.set_alias("acme", "shared", (AliasTarget("v2", 1),), "ops")
    assert reg.resolve("beta", "acme/shared@v2").revision == "v2"
    with pytest.raises(AdapterNotFoundError):
        reg.resolve("beta", "acme/shared@v1")  # no longer served by the alias


def test_listing_shows_only_usable_adapters(two_tenants: Registry) -> None:
    reg = two_tenants
    assert [a.ref for a in reg.usable_adapters("beta")] == ["acme/shared", "beta/bot"]
    assert [a.ref for a in reg.usable_adapters("acme")] == ["acme/bot", "acme/shared"]
    assert [a.ref for a in reg.usable_adapters("nobody")] == ["acme/shared"]
    assert len(reg.list_adapters()) == 3
    assert [a.ref for a in reg.list_adapters("beta")] == ["beta/bot"]


@pytest.mark.parametrize(
    "text", ["", "/", "a/b/c", "bot@", "@v1", "../bot", "bot@v1@v2", "x" * 200, "beta/bot@v9"]
)
def test_malformed_or_unknown_strings_are_not_found(two_tenants: Registry, text: str) -> None:
    message = _not_found_message(two_tenants, "acme", text)
    assert message == f"model {quoted(text)} does not name an adapter available to you"
    assert len(message) < 150  # the 200-character string is quoted by its first 64 only


def test_alias_weights_split_traffic_deterministically(two_tenants: Registry) -> None:
    reg = two_tenants
    reg.set_alias("acme", "bot", (AliasTarget("v1", 3), AliasTarget("v2", 1)), "ops")

    counts = Counter(reg.resolve("acme", "bot", request_id=f"req-{i}").revision for i in range(800))
    assert 520 < counts["v1"] < 680 and counts["v1"] + counts["v2"] == 800
    same = {reg.resolve("acme", "bot", request_id="fixed").revision for _ in range(10)}
    assert len(same) == 1


def test_a_caller_naming_itself_gets_one_draw_of_the_alias_weights(two_tenants: Registry) -> None:
    """With a ``sticky_key`` (the caller's ``user`` / session) every request of that caller gets
    the same revision, whatever its request id; callers still split by weight."""
    reg = two_tenants
    reg.set_alias("acme", "bot", (AliasTarget("v1", 3), AliasTarget("v2", 1)), "ops")
    by_caller = {
        key: {
            reg.resolve_revision("acme", "bot", f"req-{key}-{i}", sticky_key=key).revision
            for i in range(8)
        }
        for key in (f"user:{n}" for n in range(400))
    }
    assert all(len(revisions) == 1 for revisions in by_caller.values())
    counts = Counter(next(iter(revisions)) for revisions in by_caller.values())
    assert 260 < counts["v1"] < 340 and counts["v1"] + counts["v2"] == 400


def test_alias_choice_without_request_id_follows_the_injected_rng(
    two_tenants: Registry, open_reg: OpenRegistry
) -> None:
    two_tenants.set_alias("acme", "bot", (AliasTarget("v1", 1), AliasTarget("v2", 1)), "ops")
    runs = []
    for _ in range(2):
        reg = open_reg(rng=random.Random(7))
        runs.append([reg.resolve("acme", "bot").revision for _ in range(20)])
    assert runs[0] == runs[1]
    assert set(runs[0]) == {"v1", "v2"}


def test_deprecated_revisions_are_not_served_through_aliases(two_tenants: Registry) -> None:
    reg = two_tenants
    reg.set_alias("acme", "bot", (AliasTarget("v1", 1), AliasTarget("v2", 1)), "ops")
    reg.set_release("acme/bot@v1", "ops", state=RevisionState.DEPRECATED)

    served = {reg.resolve("acme", "bot", request_id=str(i)).revision for i in range(50)}
    assert served == {"v2"}
    assert reg.resolve("acme", "bot@v1").revision == "v1"  # a pin still resolves
    reg.set_release("acme/bot@v2", "ops", state=RevisionState.DEPRECATED)
    with pytest.raises(AdapterNotFoundError):
        reg.resolve("acme", "bot")


def test_the_owner_is_told_its_alias_serves_no_revision(two_tenants: Registry) -> None:
    """Every revision deprecated: the owner's ``name`` was the uniform "does not name an adapter
    available to you" while ``/v1/models`` still listed the adapter (a pin still resolves); now
    the owner is told why. Another tenant calling a public adapter so retired still gets the
    uniform message (it may not learn the owner's revision states)."""
    reg = two_tenants
    for revision in ("v1", "v2"):
        reg.set_release(f"acme/bot@{revision}", "ops", state=RevisionState.DEPRECATED)
    reg.set_release("acme/shared@v1", "ops", state=RevisionState.DEPRECATED)

    for text in ("bot", "acme/bot", "shared"):
        message = _not_found_message(reg, "acme", text)
        name = text.rsplit("/", 1)[-1]
        assert message.startswith(f"model {quoted(text)}: your adapter {quoted(name)} serves no ")
        assert f"loraplex adapters alias set acme/{name} REVISION" in message
    assert reg.resolve("acme", "bot@v1").revision == "v1"  # the hint's pin works
    uniform = f"model {quoted('acme/shared')} does not name an adapter available to you"
    assert _not_found_message(reg, "beta", "acme/shared") == uniform


def test_the_listing_holds_only_adapters_whose_alias_serves(
    two_tenants: Registry, open_reg: OpenRegistry, tmp_path: Path
) -> None:
    """``usable_adapters`` (``GET /v1/models``) listed an adapter whose alias serves no revision
    (every target deprecated, or built for another base model): a card no call could use. The
    filter is in the statement, so a page still holds ``limit`` adapters and pages on past the
    ones left out (both databases: the alias's targets are read by each one's JSON functions)."""
    reg = two_tenants
    reg.set_alias("acme", "bot", (AliasTarget("v1", 1), AliasTarget("v2", 1)), "ops")
    reg.set_release("acme/bot@v1", "ops", state=RevisionState.DEPRECATED)
    assert [a.ref for a in reg.usable_adapters("acme")] == ["acme/bot", "acme/shared"]  # v2 serves
    reg.set_release("acme/bot@v2", "ops", state=RevisionState.DEPRECATED)
    assert [a.ref for a in reg.usable_adapters("acme")] == ["acme/shared"]
    with pytest.raises(AdapterNotFoundError):  # what a call does: the listing agrees
        reg.resolve("acme", "bot")
    assert [a.ref for a in reg.usable_adapters("acme", Page(None, 1))] == ["acme/shared"]
    assert reg.usable_adapters("acme", Page("acme/shared", 1)) == []
    reg.set_release("acme/shared@v1", "ops", state=RevisionState.DEPRECATED)
    assert [a.ref for a in reg.usable_adapters("beta")] == ["beta/bot"]
    assert [a.ref for a in reg.usable_adapters("beta", Page(None, 1))] == ["beta/bot"]
    reg.set_release("acme/bot@v2", "ops", state=RevisionState.STABLE)
    assert [a.ref for a in reg.usable_adapters("acme", Page(None, 1))] == ["acme/bot"]
    other = BaseModelSpec.from_dir(write_base_model(tmp_path / "other", seed=5))
    assert open_reg(base=other).usable_adapters("acme") == []  # every revision on another base
    assert [a.ref for a in open_reg(base=None).usable_adapters("acme")] == ["acme/bot"]


def test_an_alias_of_only_deprecated_revisions_is_refused(two_tenants: Registry) -> None:
    reg = two_tenants
    reg.set_alias("acme", "bot", (AliasTarget("v2", 1),), "ops")  # rollback target: v1
    reg.set_release("acme/bot@v1", "ops", state=RevisionState.DEPRECATED)
    before = reg.get_alias("acme", "bot")

    with pytest.raises(RegistryError, match="v1 are all deprecated"):
        reg.set_alias("acme", "bot", (AliasTarget("v1", 1),), "ops")
    with pytest.raises(RegistryError, match="v1 are all deprecated"):
        reg.rollback_alias("acme", "bot", "ops")

    assert reg.get_alias("acme", "bot") == before
    assert reg.resolve("acme", "bot").revision == "v2"
    both = (AliasTarget("v1", 1), AliasTarget("v2", 1))
    assert reg.set_alias("acme", "bot", both, "ops").targets == both  # one servable suffices


def test_set_alias_keeps_a_rollback_target(two_tenants: Registry) -> None:
    reg = two_tenants
    alias = reg.set_alias("acme", "bot", (AliasTarget("v2", 1),), "ops")
    assert alias.rollback_targets == (AliasTarget("v1", 1),)
    assert reg.resolve("acme", "bot").revision == "v2"

    rolled = reg.rollback_alias("acme", "bot", "ops")

    assert rolled.targets == (AliasTarget("v1", 1),)
    assert rolled.rollback_targets == ()  # the history is used up; rollback does not swap
    assert reg.resolve("acme", "bot").revision == "v1"
    assert [e.action for e in reg.audit_log()][-2:] == ["alias.set", "alias.rollback"]
    with pytest.raises(RegistryError, match="no rollback target"):
        reg.rollback_alias("acme", "shared", "ops")


def test_alias_targets_must_be_revisions_of_the_adapter(two_tenants: Registry) -> None:
    with pytest.raises(AdapterNotFoundError, match="acme/bot@v9"):
        two_tenants.set_alias("acme", "bot", (AliasTarget("v9", 1),), "ops")
    with pytest.raises(ValueError, match="distinct"):
        two_tenants.set_alias("acme", "bot", (AliasTarget("v1", 1), AliasTarget("v1", 2)), "ops")
    with pytest.raises(ValueError, match="weight 0"):
        AliasTarget("v1", 0)


def test_release_changes_state_and_warm_policy(two_tenants: Registry) -> None:
    from loraplex.registry import WarmPolicy

    rev = two_tenants.set_release("acme/bot@v2", "ops", warm_policy=WarmPolicy.GPU)
    assert (rev.state, rev.warm_policy) == (RevisionState.STABLE, WarmPolicy.GPU)
    assert two_tenants.get_revision("acme/bot@v2").warm_policy is WarmPolicy.GPU
    assert two_tenants.audit_log()[-1].details["warm_policy"] == ["on_demand", "gpu"]


def test_revisions_of_another_base_model_are_not_served(
    two_tenants: Registry, open_reg: OpenRegistry, tmp_path: Path
) -> None:
    other = BaseModelSpec.from_dir(write_base_model(tmp_path / "other", seed=5))
    on_other = open_reg(base=other)
    with pytest.raises(AdapterNotFoundError):
        on_other.resolve("acme", "bot")
    with pytest.raises(BaseModelMismatchError, match="acme/bot@v1"):
        on_other.resolve("acme", "bot@v1")


def test_model_string_parsing() -> None:
    parsed = parse_model_string("acme/bot@v2")
    assert parsed is not None
    assert (parsed.owner, parsed.name, parsed.revision) == ("acme", "bot", "v2")
    bare = parse_model_string("bot")
    assert bare is not None and (bare.owner, bare.revision) == (None, None)
    assert parse_model_string("a/b/c") is None


@given(
    weights=st.lists(st.integers(min_value=1, max_value=100), min_size=1, max_size=6),
    unit=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_choose_target_picks_the_band_containing_unit(weights: list[int], unit: float) -> None:
    targets = tuple(AliasTarget(f"v{i}", w) for i, w in enumerate(weights))
    chosen = choose_target(targets, unit)
    index = targets.index(chosen)
    total = sum(weights)
    low, high = sum(weights[:index]) / total, sum(weights[: index + 1]) / total
    assert low <= unit < high or (index == len(targets) - 1 and unit >= low)
