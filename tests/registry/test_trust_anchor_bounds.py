"""A tenant's trust anchors are bounded (``max_trust_anchors``), and a registration's signature
check reads only the anchors its bundle names by key id (``trust_anchors.key_id``), on both
databases: it read every anchor of the tenant (PEM included) on each registration, and nothing
bounded how many a tenant had."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from registry_kit import AdapterFactory
from signing_kit import KeyPair, certificate_signer, key_pair

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.signature import AnchorKind, SignatureProblem, sign_dir
from loraplex.errors import RegistryError, SignatureError
from loraplex.registry import (
    PolicyKind,
    RegistrationRequest,
    Registry,
    RegistryConfig,
    open_registry,
)
from loraplex.registry.sql import trust as trust_rows

NUM_KEYS = 5


@pytest.fixture
def keys(tmp_path: Path) -> list[KeyPair]:
    return [key_pair(tmp_path / "keys", f"k{i}") for i in range(NUM_KEYS + 1)]


class _RowsRead:
    """Counts the trust anchor rows read back (each is built into a ``TrustAnchor``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = trust_rows._anchor

        def counted(row: object) -> object:
            self.count += 1
            return real(row)  # type: ignore[arg-type]

        monkeypatch.setattr(trust_rows, "_anchor", counted)


def _register(registry: Registry, adapter_dir: Path, revision: str) -> object:
    return registry.register(RegistrationRequest(adapter_dir, "acme", "bot", revision), "test")


def _signed(make_adapter: AdapterFactory, key: KeyPair, label: str, seed: int) -> Path:
    adapter_dir = make_adapter(label, seed=seed)
    sign_dir(adapter_dir, key.private_path)
    return adapter_dir


def test_a_registration_reads_only_the_anchor_its_signature_names(
    registry: Registry,
    make_adapter: AdapterFactory,
    keys: list[KeyPair],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry.create_tenant("acme", "test")
    for i, key in enumerate(keys[:NUM_KEYS]):
        registry.add_trust_anchor("acme", f"k{i}", AnchorKind.KEY, key.public_pem, "test")
    registry.set_trust_policy("acme", PolicyKind.SIGNED, [], "test")
    read = _RowsRead(monkeypatch)
    result = _register(registry, _signed(make_adapter, keys[NUM_KEYS - 1], "a", 0), "v1")
    assert result.revision.provenance.trust_anchor == f"k{NUM_KEYS - 1}"  # type: ignore[attr-defined]
    assert read.count == 1  # NUM_KEYS before: every anchor of the tenant
    read.count = 0
    with pytest.raises(SignatureError, match=f"{NUM_KEYS} trusted") as caught:
        _register(registry, _signed(make_adapter, keys[NUM_KEYS], "b", 1), "v2")
    assert caught.value.reason == SignatureProblem.WRONG_SIGNER
    assert read.count == 0  # no anchor has the rogue key's id
    read.count = 0
    assert registry.verify_revision("acme/bot@v1", "test").passed
    assert read.count == 1


def test_a_certificate_bundle_reads_only_its_root(
    registry: Registry,
    make_adapter: AdapterFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signers = [certificate_signer(tmp_path / "pki", f"org{i}", "pipeline") for i in range(3)]
    registry.create_tenant("acme", "test")
    for i, signer in enumerate(signers):
        registry.add_trust_anchor("acme", f"pki{i}", AnchorKind.CERTIFICATE, signer.root_pem, "t")
    adapter_dir = make_adapter("cert", seed=3)
    signer = signers[1]
    sign_dir(adapter_dir, signer.key_path, signer.leaf_path, [signer.root_path])
    read = _RowsRead(monkeypatch)
    result = _register(registry, adapter_dir, "v1")
    assert result.revision.provenance.trust_anchor == "pki1"  # type: ignore[attr-defined]
    assert read.count == 1  # 3 before


def test_a_tenants_anchors_are_bounded_by_max_trust_anchors(
    registry_config: RegistryConfig, base: BaseModelSpec, keys: list[KeyPair]
) -> None:
    config = dataclasses.replace(registry_config, max_trust_anchors=2)
    registry = open_registry(config, base=base)
    try:
        for tenant in ("acme", "globex"):
            registry.create_tenant(tenant, "test")
        registry.add_trust_anchor("acme", "k0", AnchorKind.KEY, keys[0].public_pem, "test")
        registry.add_trust_anchor("acme", "k1", AnchorKind.KEY, keys[1].public_pem, "test")
        with pytest.raises(RegistryError, match="max_trust_anchors 2"):
            registry.add_trust_anchor("acme", "k2", AnchorKind.KEY, keys[2].public_pem, "test")
        assert [a.name for a in registry.trust_anchors("acme")] == ["k0", "k1"]
        registry.add_trust_anchor("globex", "k2", AnchorKind.KEY, keys[2].public_pem, "test")
        registry.remove_trust_anchor("acme", "k0", "test")
        registry.add_trust_anchor("acme", "k2", AnchorKind.KEY, keys[2].public_pem, "test")
        added = [e.details["anchor"] for e in registry.audit_log() if e.action == "trust.add"]
        assert added == ["k0", "k1", "k2", "k2"]  # the refused one wrote nothing
    finally:
        registry.close()
    for bad in (0, 1001, True):
        with pytest.raises(ValueError, match="max_trust_anchors"):
            dataclasses.replace(registry_config, max_trust_anchors=bad)


def test_anchors_added_before_key_ids_still_verify_and_get_theirs(
    registry_config: RegistryConfig,
    base: BaseModelSpec,
    make_adapter: AdapterFactory,
    keys: list[KeyPair],
) -> None:
    """A database of schema version 6 holds anchors without a key id: a check reads them with
    the named ones until the next open fills them in (``trust.fill_key_ids``)."""
    registry = open_registry(registry_config, base=base)
    try:
        registry.create_tenant("acme", "test")
        registry.add_trust_anchor("acme", "k0", AnchorKind.KEY, keys[0].public_pem, "test")
        registry.add_trust_anchor("acme", "k1", AnchorKind.KEY, keys[1].public_pem, "test")
        registry.set_trust_policy("acme", PolicyKind.SIGNED, [], "test")
        with registry.db.transaction() as tx:
            tx.execute("UPDATE trust_anchors SET key_id = NULL")
        result = _register(registry, _signed(make_adapter, keys[1], "a", 0), "v1")
        assert result.revision.provenance.trust_anchor == "k1"  # type: ignore[attr-defined]
    finally:
        registry.close()
    registry = open_registry(registry_config, base=base)
    try:
        with registry.db.transaction(write=False) as tx:
            assert trust_rows.anchors_without_key_id(tx) == []
        result = _register(registry, _signed(make_adapter, keys[0], "b", 1), "v2")
        assert result.revision.provenance.trust_anchor == "k0"  # type: ignore[attr-defined]
    finally:
        registry.close()
