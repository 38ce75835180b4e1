"""``artifacts/signature.py``: reading, bounding and classifying model-signing bundles."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import signing_kit as kit
from signing_kit import certificate_signer, key_pair

from loraplex.artifacts.signature import (
    MAX_CHAIN_CERTIFICATES,
    MAX_SIGNATURE_BYTES,
    SIGNATURE_FILE,
    Anchor,
    AnchorIds,
    AnchorKind,
    SignatureProblem,
    anchor_ids,
    anchor_lookup,
    check_covers,
    covered_files,
    sign_dir,
    verify_dir,
)
from loraplex.errors import SignatureError


@pytest.mark.parametrize(
    ("kind", "pem", "expected"),
    [
        (AnchorKind.KEY, kit.PINNED_KEY_PEM,
         AnchorIds(kit.PINNED_KEY_FINGERPRINT, kit.PINNED_KEY_ID)),
        (AnchorKind.CERTIFICATE, kit.PINNED_ROOT_PEM,
         AnchorIds(kit.PINNED_ROOT_FINGERPRINT, kit.PINNED_ROOT_KEY_ID)),
    ],
)  # fmt: skip
def test_anchor_ids_of_a_known_key_and_root_never_change(
    kind: AnchorKind, pem: str, expected: AnchorIds
) -> None:
    """Both were computed apart before (registry ``_fingerprint``, ``anchor_key_id``): stored
    fingerprints and key ids, and bundles' key hints, must still match after one parse."""
    assert anchor_ids(kind, pem) == expected


def test_an_anchor_that_is_not_an_ec_key_or_a_certificate_is_refused_naming_pem() -> None:
    with pytest.raises(ValueError, match=r"^pem is invalid; expected a PEM X\.509 certificate"):
        anchor_ids(AnchorKind.CERTIFICATE, kit.PINNED_KEY_PEM)
    with pytest.raises(ValueError, match=r"^pem is invalid; expected a PEM elliptic-curve"):
        anchor_ids(AnchorKind.KEY, "not a key")


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 4}')
    (folder / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    return folder


def _reason(call: object) -> str:
    with pytest.raises(SignatureError) as caught:
        call()  # type: ignore[operator]
    return str(caught.value.reason)


def test_covered_files_lists_the_signed_digests(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    key = key_pair(tmp_path / "keys", "ci")
    bundle = sign_dir(folder, key.private_path).read_bytes()
    files = covered_files(bundle)
    assert sorted(files) == ["adapter_config.json", "adapter_model.safetensors"]
    verified = verify_dir(folder, bundle, [Anchor("ci", AnchorKind.KEY, key.public_pem)])
    assert verified.files == files and verified.signer == "key:ci"
    check_covers(bundle, files, "ok")  # exactly its own digests: accepted
    wrong = {**files, "adapter_model.safetensors": "0" * 64}
    assert _reason(lambda: check_covers(bundle, wrong, "x")) == SignatureProblem.SWAPPED_BUNDLE


def test_malformed_and_oversized_bundles_are_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    anchors = [Anchor("ci", AnchorKind.KEY, key_pair(tmp_path / "k", "ci").public_pem)]
    for bundle in (b"not json", b"{}", b" " * (MAX_SIGNATURE_BYTES + 1)):
        assert _reason(lambda b=bundle: verify_dir(folder, b, anchors)) == "malformed"
        assert _reason(lambda b=bundle: covered_files(b)) == "malformed"


def test_keyless_bundles_are_refused_without_the_network(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    key = key_pair(tmp_path / "keys", "ci")
    raw = json.loads(sign_dir(folder, key.private_path).read_bytes())
    pki = certificate_signer(tmp_path / "pki", "x", "someone")
    der = base64.b64encode(Path(pki.leaf_path).read_bytes()).decode()  # any bytes: never parsed
    raw["verificationMaterial"] = {"certificate": {"rawBytes": der}, "tlogEntries": []}
    bundle = json.dumps(raw).encode()
    anchors = [Anchor("ci", AnchorKind.KEY, key.public_pem)]
    assert _reason(lambda: verify_dir(folder, bundle, anchors)) == SignatureProblem.KEYLESS


def test_the_bundle_file_itself_is_not_signed_or_required(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    key = key_pair(tmp_path / "keys", "ci")
    sign_dir(folder, key.private_path)
    bundle = sign_dir(folder, key.private_path).read_bytes()  # re-signing ignores the old one
    assert SIGNATURE_FILE not in covered_files(bundle)


def test_a_link_in_the_folder_is_refused_by_name(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    key = key_pair(tmp_path / "keys", "ci")
    bundle = sign_dir(folder, key.private_path).read_bytes()
    (folder / "elsewhere").symlink_to(tmp_path / "keys" / "ci.pub.pem")
    anchors = [Anchor("ci", AnchorKind.KEY, key.public_pem)]
    assert _reason(lambda: verify_dir(folder, bundle, anchors)) == SignatureProblem.UNHASHABLE


def test_a_bundle_names_its_anchor_by_key_id(tmp_path: Path) -> None:
    """A registration reads only the anchors ``anchor_lookup`` names (``trust_anchors.key_id``):
    a key's model-signing hint, a certificate chain's subjects and issuers (the root's subject
    among them). A hint that is not a sha256 names none."""
    folder = _folder(tmp_path)
    key, other = key_pair(tmp_path / "keys", "ci"), key_pair(tmp_path / "keys", "other")
    bundle = sign_dir(folder, key.private_path).read_bytes()
    lookup = anchor_lookup(bundle)
    assert lookup.kind is AnchorKind.KEY
    assert lookup.key_ids == {anchor_ids(AnchorKind.KEY, key.public_pem).key_id}
    assert anchor_ids(AnchorKind.KEY, other.public_pem).key_id not in lookup.key_ids
    parsed = json.loads(bundle)
    parsed["verificationMaterial"]["publicKey"]["hint"] = "x" * 5000
    assert anchor_lookup(json.dumps(parsed).encode()).key_ids == frozenset()
    signer = certificate_signer(tmp_path / "pki", "acme", "pipeline")
    outsider = certificate_signer(tmp_path / "pki", "elsewhere", "pipeline")
    sign_dir(folder, signer.key_path, signer.leaf_path, [signer.root_path])
    lookup = anchor_lookup((folder / SIGNATURE_FILE).read_bytes())
    assert lookup.kind is AnchorKind.CERTIFICATE and lookup.key_ids is not None
    assert anchor_ids(AnchorKind.CERTIFICATE, signer.root_pem).key_id in lookup.key_ids
    assert anchor_ids(AnchorKind.CERTIFICATE, outsider.root_pem).key_id not in lookup.key_ids
    parsed = json.loads((folder / SIGNATURE_FILE).read_bytes())
    chain = parsed["verificationMaterial"]["x509CertificateChain"]["certificates"]
    chain[:] = chain[:1] * (MAX_CHAIN_CERTIFICATES + 1)
    too_long = json.dumps(parsed).encode()
    assert _reason(lambda: anchor_lookup(too_long)) == SignatureProblem.MALFORMED
