"""Signed adapters in the registry (issue 32): verification at registration against the tenant's
trust policy, provenance in the record, the fetch-time check and re-verification."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import signing_kit as kit
from registry_kit import AdapterFactory
from signing_kit import KeyPair, certificate_signer, key_pair

from loraplex.artifacts.signature import SIGNATURE_FILE, AnchorKind, SignatureProblem, sign_dir
from loraplex.errors import DigestMismatchError, SignatureError
from loraplex.registry import PolicyKind, RegistrationRequest, Registry

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, KeyPair]:
    return {label: key_pair(tmp_path / "keys", label) for label in ("ci", "rogue", "next")}


def _trusting(registry: Registry, keys: dict[str, KeyPair], kind: PolicyKind) -> None:
    registry.create_tenant("acme", "test")
    registry.add_trust_anchor("acme", "ci", AnchorKind.KEY, keys["ci"].public_pem, "test")
    identities = ["key:ci"] if kind is PolicyKind.IDENTITIES else []
    registry.set_trust_policy("acme", kind, identities, "test")


def _register(registry: Registry, adapter_dir: Path, revision: str = "v1") -> object:
    request = RegistrationRequest(adapter_dir, "acme", "bot", revision)
    return registry.register(request, "test")


def _signed(make_adapter: AdapterFactory, key: KeyPair, label: str = "a", seed: int = 0) -> Path:
    adapter_dir = make_adapter(label, seed=seed)
    sign_dir(adapter_dir, key.private_path)
    return adapter_dir


def test_signed_adapter_registers_with_its_provenance(
    store_choice: str,
    registry: Registry,
    make_adapter: AdapterFactory,
    keys: dict[str, KeyPair],
    tmp_path: Path,
) -> None:
    _trusting(registry, keys, PolicyKind.SIGNED)
    adapter_dir = _signed(make_adapter, keys["ci"])
    result = _register(registry, adapter_dir)
    provenance = result.revision.provenance  # type: ignore[attr-defined]
    assert provenance is not None and provenance.signer == "key:ci"
    assert provenance.trust_anchor == "ci"
    stored = registry.get_revision("acme/bot@v1")
    assert stored.provenance == provenance  # read back from the database as written
    assert provenance.verified_at == stored.created_at
    assert registry.store.exists(provenance.signature_digest)  # the bundle is a store object
    entry = [e for e in registry.audit_log() if e.action == "revision.register"][-1]
    assert entry.details["provenance"]["signer"] == "key:ci"  # type: ignore[index]
    fetched = registry.fetch(stored, tmp_path / "fetched")
    assert (fetched / WEIGHTS).read_bytes() == (adapter_dir / WEIGHTS).read_bytes()
    assert registry.check_integrity() == []


def _unsigned(adapter_dir: Path, keys: dict[str, KeyPair], make: AdapterFactory) -> None:
    (adapter_dir / SIGNATURE_FILE).unlink()


def _wrong_key(adapter_dir: Path, keys: dict[str, KeyPair], make: AdapterFactory) -> None:
    sign_dir(adapter_dir, keys["rogue"].private_path)


def _one_byte(adapter_dir: Path, keys: dict[str, KeyPair], make: AdapterFactory) -> None:
    weights = adapter_dir / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # still a valid safetensors file: only one tensor value changes
    weights.write_bytes(bytes(data))


def _extra_file(adapter_dir: Path, keys: dict[str, KeyPair], make: AdapterFactory) -> None:
    (adapter_dir / "README.md").write_text("added after signing\n")


def _removed_file(adapter_dir: Path, keys: dict[str, KeyPair], make: AdapterFactory) -> None:
    (adapter_dir / "README.md").write_text("signed, then removed\n")
    sign_dir(adapter_dir, keys["ci"].private_path)
    (adapter_dir / "README.md").unlink()


def _swapped(adapter_dir: Path, keys: dict[str, KeyPair], make: AdapterFactory) -> None:
    other = _signed(make, keys["ci"], label="other", seed=7)
    (adapter_dir / "adapter_config.json").write_text(
        (adapter_dir / "adapter_config.json").read_text().replace('"r": 4', '"r": 4 ')
    )  # same rank, other bytes: the other adapter's bundle matches none of these files
    shutil.copyfile(other / SIGNATURE_FILE, adapter_dir / SIGNATURE_FILE)


@pytest.mark.parametrize(
    ("spoil", "reason", "words"),
    [
        (_unsigned, SignatureProblem.UNSIGNED, "no signature"),
        (_wrong_key, SignatureProblem.WRONG_SIGNER, "no trust anchor"),
        (_one_byte, SignatureProblem.DIGEST_MISMATCH, WEIGHTS),
        (_extra_file, SignatureProblem.NOT_COVERED, "README.md not covered"),
        (_removed_file, SignatureProblem.MISSING_FILE, "README.md missing"),
        (_swapped, SignatureProblem.SWAPPED_BUNDLE, "other content"),
    ],
)
def test_each_failure_is_refused_with_its_own_message_and_stores_nothing(
    registry: Registry,
    make_adapter: AdapterFactory,
    keys: dict[str, KeyPair],
    spoil: object,
    reason: SignatureProblem,
    words: str,
) -> None:
    _trusting(registry, keys, PolicyKind.SIGNED)
    adapter_dir = _signed(make_adapter, keys["ci"])
    spoil(adapter_dir, keys, make_adapter)  # type: ignore[operator]
    with pytest.raises(SignatureError, match=words) as caught:
        _register(registry, adapter_dir)
    assert caught.value.reason == reason
    assert list(registry.store.digests()) == []
    assert registry.list_adapters("acme") == []
    assert not any(e.action == "revision.register" for e in registry.audit_log())


def test_a_policy_change_is_enforced_on_the_next_registration(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair]
) -> None:
    registry.create_tenant("acme", "test")
    assert registry.trust_policy("acme").kind is PolicyKind.NONE  # the default
    unsigned = _register(registry, make_adapter("u1"), "v1")
    assert unsigned.revision.provenance is None  # type: ignore[attr-defined]
    registry.add_trust_anchor("acme", "ci", AnchorKind.KEY, keys["ci"].public_pem, "test")
    registry.set_trust_policy("acme", PolicyKind.SIGNED, [], "test")
    with pytest.raises(SignatureError) as caught:
        _register(registry, make_adapter("u2", seed=2), "v2")
    assert caught.value.reason == SignatureProblem.UNSIGNED
    registry.set_trust_policy("acme", PolicyKind.IDENTITIES, ["key:release"], "test")
    with pytest.raises(SignatureError, match="key:ci") as caught:
        _register(registry, _signed(make_adapter, keys["ci"], "s3", seed=3), "v3")
    assert caught.value.reason == SignatureProblem.IDENTITY
    registry.set_trust_policy("acme", PolicyKind.IDENTITIES, ["key:ci"], "test")
    ok = _register(registry, _signed(make_adapter, keys["ci"], "s4", seed=4), "v4")
    assert ok.revision.provenance.signer == "key:ci"  # type: ignore[attr-defined]
    assert registry.get_revision("acme/bot@v1").provenance is None  # earlier records unchanged
    policies = [e for e in registry.audit_log() if e.action == "trust.policy"]
    assert [e.details["policy"] for e in policies] == ["signed", "identities", "identities"]


def test_an_offered_signature_is_verified_even_under_policy_none(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair]
) -> None:
    registry.create_tenant("acme", "test")
    with pytest.raises(SignatureError) as caught:
        _register(registry, _signed(make_adapter, keys["ci"]))
    assert caught.value.reason == SignatureProblem.NO_TRUST
    registry.add_trust_anchor("acme", "ci", AnchorKind.KEY, keys["ci"].public_pem, "test")
    result = _register(registry, _signed(make_adapter, keys["ci"], "b"))
    assert result.revision.provenance is not None  # type: ignore[attr-defined]


def test_certificate_signing_and_identities(
    registry: Registry, make_adapter: AdapterFactory, tmp_path: Path
) -> None:
    signer = certificate_signer(tmp_path / "pki", "acme-ci", "release-pipeline")
    outsider = certificate_signer(tmp_path / "pki", "elsewhere", "release-pipeline")
    registry.create_tenant("acme", "test")
    registry.add_trust_anchor("acme", "pki", AnchorKind.CERTIFICATE, signer.root_pem, "test")
    registry.set_trust_policy("acme", PolicyKind.IDENTITIES, [signer.subject], "test")
    foreign = make_adapter("foreign")
    sign_dir(foreign, outsider.key_path, outsider.leaf_path, [outsider.root_path])
    with pytest.raises(SignatureError) as caught:
        _register(registry, foreign, "v0")
    assert caught.value.reason == SignatureProblem.WRONG_SIGNER
    adapter_dir = make_adapter("cert", seed=1)
    sign_dir(adapter_dir, signer.key_path, signer.leaf_path, [signer.root_path])
    result = _register(registry, adapter_dir)
    provenance = result.revision.provenance  # type: ignore[attr-defined]
    assert provenance.signer == signer.subject and "CN=release-pipeline" in signer.subject
    assert provenance.trust_anchor == "pki"


def test_removing_a_key_keeps_the_record_and_verify_uses_todays_policy(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair]
) -> None:
    _trusting(registry, keys, PolicyKind.SIGNED)
    _register(registry, _signed(make_adapter, keys["ci"]))
    before = registry.get_revision("acme/bot@v1")
    assert registry.verify_revision("acme/bot@v1", "test").passed
    registry.add_trust_anchor("acme", "next", AnchorKind.KEY, keys["next"].public_pem, "test")
    registry.remove_trust_anchor("acme", "ci", "test")
    assert registry.get_revision("acme/bot@v1") == before  # still says ci verified it, and when
    report = registry.verify_revision("acme/bot@v1", "test")
    assert not report.passed and report.reason == SignatureProblem.WRONG_SIGNER
    assert [a.name for a in registry.trust_anchors("acme")] == ["next"]
    verifies = [e for e in registry.audit_log() if e.action == "revision.verify"]
    assert [e.details["passed"] for e in verifies] == [True, False]
    with pytest.raises(SignatureError) as caught:  # new registrations need the new key
        _register(registry, _signed(make_adapter, keys["ci"], "again", seed=5), "v2")
    assert caught.value.reason == SignatureProblem.WRONG_SIGNER


def test_a_swapped_store_bundle_is_refused_at_fetch(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair], tmp_path: Path
) -> None:
    _trusting(registry, keys, PolicyKind.SIGNED)
    _register(registry, _signed(make_adapter, keys["ci"]), "v1")
    _register(registry, _signed(make_adapter, keys["ci"], "b", seed=9), "v2")
    first, second = registry.get_revision("acme/bot@v1"), registry.get_revision("acme/bot@v2")
    assert first.provenance is not None and second.provenance is not None
    store_root = Path(registry.store.url.removeprefix("file://"))
    if not store_root.is_dir():
        pytest.skip("the object is swapped by path: local store only")
    target = store_root / "sha256" / first.provenance.signature_digest[:2]
    source = store_root / "sha256" / second.provenance.signature_digest[:2]
    shutil.copyfile(
        source / second.provenance.signature_digest, target / first.provenance.signature_digest
    )
    with pytest.raises(SignatureError, match="was replaced") as caught:
        registry.fetch(first, tmp_path / "fetched")
    assert caught.value.reason == SignatureProblem.SWAPPED_BUNDLE
    assert not (tmp_path / "fetched" / WEIGHTS).exists()  # refused before any byte was written
    report = registry.verify_revision("acme/bot@v1", "test")
    assert not report.passed and report.reason == SignatureProblem.SWAPPED_BUNDLE


def test_anchors_are_validated(registry: Registry, keys: dict[str, KeyPair]) -> None:
    registry.create_tenant("acme", "test")
    with pytest.raises(ValueError, match="pem is invalid"):
        registry.add_trust_anchor("acme", "bad", AnchorKind.KEY, "not a key", "test")
    with pytest.raises(ValueError, match="pem is invalid"):
        registry.add_trust_anchor("acme", "bad", AnchorKind.CERTIFICATE, keys["ci"].public_pem, "t")
    with pytest.raises(ValueError, match="identities"):
        registry.set_trust_policy("acme", PolicyKind.IDENTITIES, [], "test")
    with pytest.raises(ValueError, match="identities"):
        registry.set_trust_policy("acme", PolicyKind.SIGNED, ["key:ci"], "test")
    assert registry.trust_anchors("acme") == []


def test_a_known_anchor_is_stored_with_its_pinned_fingerprint_and_key_id(
    registry: Registry,
) -> None:
    registry.create_tenant("acme", "test")
    registry.add_trust_anchor("acme", "key", AnchorKind.KEY, kit.PINNED_KEY_PEM, "test")
    registry.add_trust_anchor("acme", "root", AnchorKind.CERTIFICATE, kit.PINNED_ROOT_PEM, "t")
    with registry.db.transaction(write=False) as tx:
        stored = tx.query("SELECT name, fingerprint, key_id FROM trust_anchors ORDER BY name", ())
    assert [tuple(row) for row in stored] == [
        ("key", kit.PINNED_KEY_FINGERPRINT, kit.PINNED_KEY_ID),
        ("root", kit.PINNED_ROOT_FINGERPRINT, kit.PINNED_ROOT_KEY_ID),
    ]


def test_provenance_is_immutable_in_the_database(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair]
) -> None:
    _trusting(registry, keys, PolicyKind.SIGNED)
    _register(registry, _signed(make_adapter, keys["ci"]))
    before = registry.get_revision("acme/bot@v1")
    for statement in (
        "UPDATE revisions SET signer = 'key:mallory'",
        "UPDATE revisions SET signature_digest = NULL",
        "UPDATE revisions SET verified_at = 0",
    ):
        with pytest.raises(Exception, match=r"(?i)revision"), registry.db.transaction() as tx:
            tx.execute(statement)
    assert registry.get_revision("acme/bot@v1") == before


def test_verify_passes_a_revision_whose_signature_also_covers_a_model_card(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair]
) -> None:
    """PEFT's save_pretrained writes a README.md beside the two files; signed with them, the
    folder registers (registry.md: the signature must cover such a file), but only the two PEFT
    files are stored. ``adapters verify`` judged the stored revision FAILS (missing_file: signed
    README.md missing) although nothing was wrong with it (newop4)."""
    _trusting(registry, keys, PolicyKind.SIGNED)
    adapter_dir = make_adapter("carded")
    (adapter_dir / "README.md").write_text("# a model card\n", encoding="utf-8")
    sign_dir(adapter_dir, keys["ci"].private_path)
    _register(registry, adapter_dir)
    report = registry.verify_revision("acme/bot@v1", "test")
    assert report.passed, report.message
    assert report.signer == "key:ci"
    assert "README.md" in report.message  # said: signed and checked at registration, not stored


def test_verify_still_refuses_a_stored_object_the_card_signature_does_not_match(
    registry: Registry, make_adapter: AdapterFactory, keys: dict[str, KeyPair]
) -> None:
    """Leaving the unstored card out of the comparison leaves the stored files checked: a changed
    stored object still fails ``adapters verify`` (the store's own digest check, first)."""
    _trusting(registry, keys, PolicyKind.SIGNED)
    adapter_dir = make_adapter("carded")
    (adapter_dir / "README.md").write_text("# a model card\n", encoding="utf-8")
    sign_dir(adapter_dir, keys["ci"].private_path)
    _register(registry, adapter_dir)
    stored = registry.get_revision("acme/bot@v1")
    path = registry.store.path_for(stored.adapter_digest)  # type: ignore[attr-defined]
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError):
        registry.verify_revision("acme/bot@v1", "test")
