"""``loraplex tenants trust ...``, ``adapters sign|verify`` and the provenance ``adapters show``
prints, end to end through the CLI (SQLite + local store)."""

from __future__ import annotations

from pathlib import Path

from registry_kit import AdapterFactory
from signing_kit import certificate_signer, key_pair
from typer.testing import CliRunner

from loraplex.cli import app


def _run(env: dict[str, str], *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output
    return result.output


def test_trust_sign_register_show_verify(
    tmp_path: Path, model_dir: Path, make_adapter: AdapterFactory
) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "data"), "LORAPLEX_BASE_MODEL": str(model_dir)}
    ci, rogue = key_pair(tmp_path / "keys", "ci"), key_pair(tmp_path / "keys", "rogue")
    _run(env, "tenants", "create", "acme")
    added = _run(env, "tenants", "trust", "add", "acme", "ci", "--key", str(ci.public_path))
    assert added.startswith("trusted key ci sha256=")
    _run(env, "tenants", "trust", "policy", "acme", "signed")
    listed = _run(env, "tenants", "trust", "list", "acme")
    assert "policy\tsigned\tidentities=-" in listed and "key\tci\tsha256=" in listed

    adapter_dir = make_adapter("a")
    register = ("adapters", "register", str(adapter_dir), "--tenant", "acme", "--name", "bot")
    refused = _run(env, *register, "--revision", "v0", code=1)
    assert "requires signed adapters" in refused and "no signature" in refused
    signed = _run(env, "adapters", "sign", str(adapter_dir), "--key", str(ci.private_path))
    assert (adapter_dir / "model.sig").is_file() and "model.sig" in signed
    assert _run(env, *register, "--revision", "v1").startswith("registered acme/bot@v1")
    shown = _run(env, "adapters", "show", "acme/bot")
    assert "signed by key:ci (anchor ci) verified=" in shown

    assert "passes policy signed" in _run(env, "adapters", "verify", "acme/bot@v1")
    _run(env, "tenants", "trust", "add", "acme", "rogue", "--key", str(rogue.public_path))
    _run(env, "tenants", "trust", "remove", "acme", "ci")
    failed = _run(env, "adapters", "verify", "acme/bot@v1", code=1)
    assert "FAILS (wrong_signer)" in failed and "signed by key:ci" in failed  # record kept
    _run(env, "tenants", "trust", "policy", "acme", "none")
    # verify reads today's policy; an offered signature is checked even under "none"
    assert "FAILS (wrong_signer) policy none" in _run(
        env, "adapters", "verify", "acme/bot@v1", code=1
    )


def test_certificate_anchor_and_identity_policy(
    tmp_path: Path, model_dir: Path, make_adapter: AdapterFactory
) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "data"), "LORAPLEX_BASE_MODEL": str(model_dir)}
    pki = certificate_signer(tmp_path / "pki", "acme", "pipeline")
    _run(env, "tenants", "create", "acme")
    _run(env, "tenants", "trust", "add", "acme", "root", "--certificate", str(pki.root_path))
    _run(env, "tenants", "trust", "policy", "acme", "identities", "--identity", pki.subject)
    adapter_dir = make_adapter("a")
    sign = ("adapters", "sign", str(adapter_dir), "--key", str(pki.key_path))
    _run(env, *sign, "--certificate", str(pki.leaf_path), "--chain", str(pki.root_path))
    register = ("adapters", "register", str(adapter_dir), "--tenant", "acme", "--name", "bot")
    assert _run(env, *register, "--revision", "v1").startswith("registered")
    assert f"signed by {pki.subject} (anchor root)" in _run(env, "adapters", "show", "acme/bot")


def test_bad_trust_input_is_refused_by_name(tmp_path: Path, make_adapter: AdapterFactory) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "data")}
    ci = key_pair(tmp_path / "keys", "ci")
    _run(env, "tenants", "create", "acme")
    both = _run(
        env, "tenants", "trust", "add", "acme", "x",
        "--key", str(ci.public_path), "--certificate", str(ci.public_path), code=1,
    )  # fmt: skip
    assert "--key and --certificate" in both
    not_a_cert = _run(
        env, "tenants", "trust", "add", "acme", "x", "--certificate", str(ci.public_path), code=1
    )
    assert "pem is invalid" in not_a_cert
    assert "identities" in _run(env, "tenants", "trust", "policy", "acme", "identities", code=1)
    assert "does not exist" in _run(env, "tenants", "trust", "remove", "acme", "nope", code=1)
    chain = _run(
        env, "adapters", "sign", str(make_adapter("a")), "--key", str(ci.private_path),
        "--chain", str(ci.public_path), code=1,
    )  # fmt: skip
    assert "--chain is invalid without --certificate" in chain


def test_trust_add_refuses_past_max_trust_anchors(tmp_path: Path) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "data")}
    keys = [key_pair(tmp_path / "keys", f"k{i}") for i in range(3)]
    _run(env, "tenants", "create", "acme")
    add = ("tenants", "trust", "add", "acme")
    _run(env, *add, "k0", "--key", str(keys[0].public_path), "--max-trust-anchors", "2")
    _run(env, *add, "k1", "--key", str(keys[1].public_path), "--max-trust-anchors", "2")
    refused = _run(
        env, *add, "k2", "--key", str(keys[2].public_path), "--max-trust-anchors", "2", code=1
    )
    assert "max_trust_anchors 2" in refused
    assert "max_trust_anchors 0 is invalid" in _run(
        env, *add, "k2", "--key", str(keys[2].public_path), "--max-trust-anchors", "0", code=1
    )
    _run(env, *add, "k2", "--key", str(keys[2].public_path))  # the default: 16


def test_an_unknown_trust_policy_names_the_argument_and_the_kinds(tmp_path: Path) -> None:
    """typer refused it with pydantic's "Value error, 'signd' is not one of 'none', ..."."""
    env = {"LORAPLEX_DATA_DIR": str(tmp_path / "data")}
    _run(env, "tenants", "create", "acme")
    refused = _run(env, "tenants", "trust", "policy", "acme", "signd", code=2)
    out = " ".join(refused.replace("\u2502", " ").split())  # without typer's error box
    assert "Invalid value for 'policy': 'signd' is not one of none, signed, identities" in out
    assert "Value error" not in out
    assert "policy signed for acme" in _run(env, "tenants", "trust", "policy", "acme", "signed")
