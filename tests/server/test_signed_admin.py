"""Signed adapters over the admin API (upload part, import directory), provenance in its answers
and the audit log, and ``signed`` in /v1/models for the owning tenant only (issue 32)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from signing_kit import KeyPair, key_pair

from loraplex.artifacts.signature import SIGNATURE_FILE, AnchorKind, sign_dir
from loraplex.registry import PolicyKind, Visibility
from loraplex.server.app import create_app

TENANT = "signco"


@pytest.fixture(scope="module")
def ci_key(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return key_pair(tmp_path_factory.mktemp("keys"), "ci")


@pytest.fixture
def signed_rig(served: Served, ci_key: KeyPair, tmp_path: Path) -> Iterator[Rig]:
    """A rig whose import directory is the test's own, and a tenant that requires signatures."""
    if TENANT not in {t.name for t in served.registry.list_tenants()}:
        served.registry.create_tenant(TENANT, "test")
        served.registry.create_key(TENANT, "test")
        served.registry.add_trust_anchor(TENANT, "ci", AnchorKind.KEY, ci_key.public_pem, "t")
        served.registry.set_trust_policy(TENANT, PolicyKind.SIGNED, [], "test")
    (tmp_path / "imports").mkdir()
    engine = FakeEngine()
    deps = make_app_deps(served, engine)
    deps = replace(deps, config=replace(deps.config, import_dir=tmp_path / "imports"))
    assert deps.cache is not None
    with TestClient(create_app(deps)) as client:
        yield Rig(client, engine, served, deps.cache)
    deps.cache.close()


def _copy(served: Served, dest: Path) -> Path:
    shutil.copytree(served.assets.adapter("acme", "support", "r1").path, dest)
    return dest


def _upload(rig: Rig, adapter_dir: Path, revision: str, signature: bool = True) -> object:
    files = {
        "config": ("c", (adapter_dir / "adapter_config.json").read_bytes()),
        "weights": ("w", (adapter_dir / "adapter_model.safetensors").read_bytes()),
    }
    if signature:
        files["signature"] = ("model.sig", (adapter_dir / SIGNATURE_FILE).read_bytes())
    form = {"tenant": TENANT, "name": "uploaded", "revision": revision}
    return rig.client.post("/admin/adapters/upload", files=files, data=form, headers=rig.admin)


def test_signed_upload_registers_with_provenance_and_serves(
    signed_rig: Rig, ci_key: KeyPair, tmp_path: Path
) -> None:
    rig = signed_rig
    adapter_dir = _copy(rig.served, tmp_path / "a")
    sign_dir(adapter_dir, ci_key.private_path)
    unsigned = _upload(rig, adapter_dir, "u0", signature=False)
    assert unsigned.status_code == 422, unsigned.text  # type: ignore[attr-defined]
    assert "no signature" in unsigned.json()["error"]["message"]  # type: ignore[attr-defined]
    ok = _upload(rig, adapter_dir, "u1")
    assert ok.status_code == 201, ok.text  # type: ignore[attr-defined]
    provenance = ok.json()["revision"]["provenance"]  # type: ignore[attr-defined]
    assert provenance["signer"] == "key:ci" and provenance["trust_anchor"] == "ci"
    shown = rig.client.get(f"/admin/adapters/{TENANT}/uploaded", headers=rig.admin).json()
    assert shown["revisions"][0]["provenance"] == provenance
    audit = rig.client.get("/admin/audit", params={"limit": 1000}, headers=rig.admin).json()
    registered = [e for e in audit if e["subject"] == f"{TENANT}/uploaded@u1"]
    assert registered[0]["details"]["provenance"]["signer"] == "key:ci"
    key = rig.served.registry.create_key(TENANT, "test").token
    owner = {"Authorization": f"Bearer {key}"}
    reply = rig.client.post(
        "/v1/completions", json={"model": "uploaded", "prompt": "x"}, headers=owner
    )
    assert reply.json()["loraplex"]["revision"] == f"{TENANT}/uploaded@u1"


def test_tampered_upload_is_refused_and_stores_nothing(
    signed_rig: Rig, ci_key: KeyPair, tmp_path: Path
) -> None:
    rig = signed_rig
    adapter_dir = _copy(rig.served, tmp_path / "a")
    sign_dir(adapter_dir, ci_key.private_path)
    config = adapter_dir / "adapter_config.json"
    config.write_text(config.read_text() + " ")
    before = set(rig.served.registry.store.digests())
    bad = _upload(rig, adapter_dir, "t1")
    assert bad.status_code == 422  # type: ignore[attr-defined]
    assert "adapter_config.json differs" in bad.json()["error"]["message"]  # type: ignore[attr-defined]
    assert set(rig.served.registry.store.digests()) == before


def test_import_directory_carries_model_sig_and_its_covered_files(
    signed_rig: Rig, ci_key: KeyPair, tmp_path: Path
) -> None:
    rig = signed_rig
    folder = _copy(rig.served, tmp_path / "imports" / "signed")
    (folder / "README.md").write_text("model card, covered by the signature\n")
    sign_dir(folder, ci_key.private_path)
    body = {"path": "signed", "tenant": TENANT, "name": "imported", "revision": "i1"}
    ok = rig.client.post("/admin/adapters", json=body, headers=rig.admin)
    assert ok.status_code == 201, ok.text
    assert ok.json()["revision"]["provenance"]["signer"] == "key:ci"
    (folder / "README.md").write_text("edited after signing\n")
    body["revision"] = "i2"
    bad = rig.client.post("/admin/adapters", json=body, headers=rig.admin)
    assert bad.status_code == 422 and "README.md" in bad.json()["error"]["message"]


def test_models_listing_shows_signed_to_the_owner_only(
    signed_rig: Rig, ci_key: KeyPair, tmp_path: Path
) -> None:
    rig = signed_rig
    registry = rig.served.registry
    adapter_dir = _copy(rig.served, tmp_path / "a")
    sign_dir(adapter_dir, ci_key.private_path)
    assert _upload(rig, adapter_dir, "m1").status_code in (200, 201)  # type: ignore[attr-defined]
    registry.set_visibility(TENANT, "uploaded", Visibility.PUBLIC, "test")
    try:
        owner = {"Authorization": f"Bearer {registry.create_key(TENANT, 'test').token}"}
        mine = rig.client.get("/v1/models", headers=owner).json()["data"]
        assert {m["id"]: m["signed"] for m in mine[1:]}["uploaded"] is True
        assert mine[0]["signed"] is None  # the base model
        theirs = rig.client.get("/v1/models", headers=rig.headers("acme")).json()["data"]
        shared = [m for m in theirs if m["root"] == f"{TENANT}/uploaded"]
        assert shared and shared[0]["signed"] is None
        own_unsigned = [m for m in theirs if m["owned_by"] == "acme"]
        assert own_unsigned and all(m["signed"] is False for m in own_unsigned)
        for params in ({"limit": 2}, {"after": "a"}):
            page = rig.client.get("/v1/models", params=params, headers=owner).json()["data"]
            assert page and all(m in mine for m in page)  # paged: the same cards, signed too
        for card in mine[1:]:  # each own card alone on its page reads only its own revisions
            alone = {"limit": 1, "after": mine[mine.index(card) - 1]["id"]}
            assert rig.client.get("/v1/models", params=alone, headers=owner).json()["data"] == [
                card
            ]
        one = rig.client.get("/v1/models/uploaded", headers=owner).json()
        assert one["signed"] is True
        other = rig.client.get(f"/v1/models/{TENANT}/uploaded", headers=rig.headers("acme"))
        assert other.json()["signed"] is None
    finally:
        registry.set_visibility(TENANT, "uploaded", Visibility.PRIVATE, "test")


def test_vllm_load_lora_adapter_verifies_the_signature(
    signed_rig: Rig, ci_key: KeyPair, tmp_path: Path
) -> None:
    rig = signed_rig
    folder = _copy(rig.served, tmp_path / "imports" / "vllm")
    unsigned = {"lora_name": f"{TENANT}/loaded@l0", "lora_path": "vllm"}
    refused = rig.client.post("/v1/load_lora_adapter", json=unsigned, headers=rig.admin)
    assert refused.status_code == 422 and "no signature" in refused.json()["error"]["message"]
    sign_dir(folder, ci_key.private_path)
    body = {"lora_name": f"{TENANT}/loaded@l1", "lora_path": "vllm"}
    loaded = rig.client.post("/v1/load_lora_adapter", json=body, headers=rig.admin)
    assert loaded.status_code == 200, loaded.text
    provenance = rig.served.registry.get_revision(f"{TENANT}/loaded@l1").provenance
    assert provenance is not None and provenance.signer == "key:ci"


def test_an_upload_signed_with_a_model_card_is_told_to_sign_only_the_two_files(
    signed_rig: Rig, ci_key: KeyPair, tmp_path: Path
) -> None:
    """PEFT's save_pretrained writes a README.md; a folder signed with it and uploaded (only the
    two PEFT files and the bundle travel) was refused with "signed file(s) README.md missing from
    the folder": no folder was sent, and nothing said what to sign instead (newop4)."""
    rig = signed_rig
    adapter_dir = _copy(rig.served, tmp_path / "carded")
    (adapter_dir / "README.md").write_text("# a model card\n", encoding="utf-8")
    sign_dir(adapter_dir, ci_key.private_path)
    refused = _upload(rig, adapter_dir, "c1")
    assert refused.status_code == 422, refused.text  # type: ignore[attr-defined]
    message = refused.json()["error"]["message"]  # type: ignore[attr-defined]
    assert "README.md" in message
    assert "adapter_config.json and adapter_model.safetensors" in message
    shown = rig.client.get(f"/admin/adapters/{TENANT}/uploaded", headers=rig.admin)
    assert "c1" not in {r["revision"] for r in shown.json().get("revisions", [])}
