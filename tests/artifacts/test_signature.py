"""``artifacts/signature.py``: reading, bounding and classifying model-signing bundles."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from signing_kit import certificate_signer, key_pair

from loraplex.artifacts.signature import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE_FILE,
    Anchor,
    AnchorKind,
    SignatureProblem,
    check_covers,
    covered_files,
    sign_dir,
    verify_dir,
)
from loraplex.errors import SignatureError


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
