"""Registration on both databases and both stores: validate, store, record; immutability."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
from registry_kit import AdapterFactory, OpenRegistry, write_base_model

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.errors import (
    AdapterNotFoundError,
    BaseModelMismatchError,
    RankTooLargeError,
    RegistryError,
    RevisionConflictError,
    UnsafeFormatError,
)
from loraplex.registry import (
    RegistrationRequest,
    Registry,
    RevisionState,
    Visibility,
    WarmPolicy,
)

pytestmark = pytest.mark.usefixtures("store_choice")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stored_objects(registry: Registry) -> set[str]:
    return set(registry.store.digests())


def test_register_records_revision_objects_alias_and_audit(
    registry: Registry, make_adapter: AdapterFactory, base: BaseModelSpec, tmp_path: Path
) -> None:
    registry.create_tenant("acme", "admin")
    adapter_dir = make_adapter("a", rank=8, modules=("q_proj", "down_proj"))
    request = RegistrationRequest(
        adapter_dir, "acme", "support", "v1", probe_prompt="hi", expected_continuation="there"
    )
    result = registry.register(request, "admin")

    rev = result.revision
    assert result.created
    assert rev.adapter_digest == _sha256(adapter_dir / "adapter_model.safetensors")
    assert rev.config_digest == _sha256(adapter_dir / "adapter_config.json")
    assert rev.base_digest == base.digest
    assert (rev.max_rank, rev.lora_alpha, rev.use_rslora) == (8, 16.0, False)
    assert rev.target_modules == ("q_proj", "down_proj")
    assert rev.dtype == "float32"
    assert rev.state is RevisionState.STABLE and rev.warm_policy is WarmPolicy.ON_DEMAND
    assert (rev.probe_prompt, rev.expected_continuation) == ("hi", "there")
    assert rev.store_url == registry.store.url
    assert registry.get_revision("acme/support@v1") == rev
    assert _stored_objects(registry) == {rev.adapter_digest, rev.config_digest}
    assert registry.get_adapter("acme", "support").visibility is Visibility.PRIVATE
    alias = registry.get_alias("acme", "support")
    assert alias is not None and [t.revision for t in alias.targets] == ["v1"]
    last = registry.audit_log()[-1]
    assert (last.action, last.subject, last.actor) == ("revision.register", rev.ref, "admin")
    assert last.details["adapter_digest"] == rev.adapter_digest
    assert registry.check_integrity() == []

    fetched = registry.fetch(rev, tmp_path / "fetched")
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (fetched / name).read_bytes() == (adapter_dir / name).read_bytes()


def test_identical_reregistration_is_a_noop(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    registry.create_tenant("acme", "admin")
    first = registry.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "x")
    audit_len = len(registry.audit_log())

    copy = make_adapter("copy")  # same seed: byte-identical files in another directory
    again = registry.register(RegistrationRequest(copy, "acme", "bot", "v1"), "x")

    assert not again.created
    assert again.revision == first.revision
    assert len(registry.audit_log()) == audit_len


def test_reregistration_with_different_bytes_is_refused(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    registry.create_tenant("acme", "admin")
    first = registry.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "x")
    objects = _stored_objects(registry)

    other = make_adapter("b", seed=1)
    with pytest.raises(RevisionConflictError, match=r"acme/bot@v1 is already registered"):
        registry.register(RegistrationRequest(other, "acme", "bot", "v1"), "x")

    assert registry.get_revision("acme/bot@v1") == first.revision
    assert _stored_objects(registry) == objects
    assert registry.list_revisions("acme", "bot") == [first.revision]


def test_new_revision_keeps_alias_until_changed(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    registry.create_tenant("acme", "admin")
    registry.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "x")
    request = RegistrationRequest(
        make_adapter("b", seed=1), "acme", "bot", "v2", state=RevisionState.CANARY
    )
    v2 = registry.register(request, "x").revision

    assert v2.state is RevisionState.CANARY
    assert [r.revision for r in registry.list_revisions("acme", "bot")] == ["v1", "v2"]
    alias = registry.get_alias("acme", "bot")
    assert alias is not None and [t.revision for t in alias.targets] == ["v1"]


def test_unknown_tenant_is_refused_before_anything_is_stored(
    registry: Registry, make_adapter: AdapterFactory
) -> None:
    with pytest.raises(RegistryError, match=r"tenant 'ghost' does not exist"):
        registry.register(RegistrationRequest(make_adapter("a"), "ghost", "bot", "v1"), "x")
    assert _stored_objects(registry) == set()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"rank": 128}, RankTooLargeError),
        ({"base_name": "other-model"}, BaseModelMismatchError),
    ],
)
def test_invalid_adapter_changes_nothing(
    registry: Registry,
    make_adapter: AdapterFactory,
    kwargs: dict[str, object],
    error: type[Exception],
) -> None:
    registry.create_tenant("acme", "admin")
    audit_len = len(registry.audit_log())
    with pytest.raises(error):
        registry.register(RegistrationRequest(make_adapter("a", **kwargs), "acme", "b", "v1"), "x")
    assert _stored_objects(registry) == set()
    assert registry.list_adapters() == []
    assert len(registry.audit_log()) == audit_len


def test_pickle_file_is_refused(registry: Registry, make_adapter: AdapterFactory) -> None:
    registry.create_tenant("acme", "admin")
    adapter_dir = make_adapter("a")
    (adapter_dir / "adapter_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(UnsafeFormatError):
        registry.register(RegistrationRequest(adapter_dir, "acme", "b", "v1"), "x")
    assert _stored_objects(registry) == set()


def test_adapter_for_another_base_checkpoint_is_refused(
    open_reg: OpenRegistry, make_adapter: AdapterFactory, tmp_path: Path
) -> None:
    """Same name and shapes, different weights: the base digest decides."""
    other = BaseModelSpec.from_dir(write_base_model(tmp_path / "other", seed=1))
    first = open_reg()
    first.create_tenant("acme", "admin")
    first.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "x")
    on_other = open_reg(base=other)

    with pytest.raises(RevisionConflictError, match="base"):
        on_other.register(RegistrationRequest(make_adapter("a2"), "acme", "bot", "v1"), "x")
    v2 = on_other.register(RegistrationRequest(make_adapter("a3"), "acme", "bot", "v2"), "x")
    assert v2.revision.base_digest == other.digest


def test_everything_survives_a_restart(
    open_reg: OpenRegistry, make_adapter: AdapterFactory
) -> None:
    first = open_reg()
    first.create_tenant("acme", "admin")
    key = first.create_key("acme", "admin")
    rev = first.register(RegistrationRequest(make_adapter("a"), "acme", "bot", "v1"), "x")
    first.set_visibility("acme", "bot", Visibility.PUBLIC, "admin")
    log = first.audit_log()
    first.close()

    reopened = open_reg()
    assert [t.name for t in reopened.list_tenants()] == ["acme"]
    assert reopened.authenticate(key.token).name == "acme"
    assert reopened.get_revision("acme/bot@v1") == rev.revision
    assert reopened.get_adapter("acme", "bot").visibility is Visibility.PUBLIC
    assert reopened.audit_log() == log
    assert reopened.check_integrity() == []


def test_admin_lookups_of_missing_things_raise(registry: Registry) -> None:
    registry.create_tenant("acme", "admin")
    with pytest.raises(AdapterNotFoundError):
        registry.get_adapter("acme", "nope")
    with pytest.raises(AdapterNotFoundError):
        registry.get_revision("acme/nope@v1")
    with pytest.raises(ValueError, match="tenant/name@revision"):
        registry.get_revision("nope")


def test_an_exclude_entry_that_excludes_nothing_is_registered_and_said(
    registry: Registry, make_adapter: AdapterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """attack24: PEFT warns, so loraplex does too, visibly: the result carries the warning (the
    admin API answers it, the CLI prints it) and it is logged. NOTE: it was accepted in
    silence; refusing it would refuse a PEFT-valid ``exclude_modules ["lm_head"]``."""
    registry.create_tenant("acme", "admin")
    adapter_dir = make_adapter("a", modules=("q_proj", "v_proj"))
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config["exclude_modules"] = ["lm_head"]
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="loraplex.registry.registry"):
        result = registry.register(RegistrationRequest(adapter_dir, "acme", "bot", "v1"), "x")
    assert result.created and result.revision.target_modules == ("q_proj", "v_proj")
    (warning,) = result.warnings
    assert warning.startswith("exclude_modules entries ['lm_head'] exclude none of the")
    assert [r.getMessage() for r in caplog.records] == [f"registering acme/bot@v1: {warning}"]
    again = registry.register(RegistrationRequest(adapter_dir, "acme", "bot", "v1"), "x")
    assert not again.created and again.warnings == result.warnings  # a no-op says it too
    plain = registry.register(RegistrationRequest(make_adapter("b"), "acme", "bot", "v2"), "x")
    assert plain.warnings == ()
