"""A signed demo adapter registers and serves on the real engine, and a revision whose stored
bundle was swapped after registration is refused at its first cold load (L3 -> L2 fetch)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from live import Live, client, live_server
from signing_kit import KeyPair, key_pair

from loraplex.artifacts.signature import AnchorKind, sign_dir
from loraplex.artifacts.store import LocalArtifactStore
from loraplex.demo.assets import DemoAssets
from loraplex.registry import PolicyKind, RegistrationRequest


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("serve-signed")
    with live_server(demo_assets, data_dir, max_loras=2, max_num_seqs=4) as server:
        yield server


@pytest.fixture(scope="module")
def ci_key(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return key_pair(tmp_path_factory.mktemp("keys"), "ci")


def _register_signed(live: Live, key: KeyPair, revision: str, workdir: Path) -> None:
    demo = live.assets.adapter("acme", "support", "r1")
    folder = workdir / revision
    shutil.copytree(demo.path, folder)
    sign_dir(folder, key.private_path)
    request = RegistrationRequest(
        folder, "acme", "support", revision,
        probe_prompt=demo.probe_prompt, expected_continuation=demo.expected_continuation,
    )  # fmt: skip
    result = live.server.registry.register(request, "test")
    assert result.revision.provenance is not None and result.revision.provenance.signer == "key:ci"


def test_signed_adapter_serves_and_a_swapped_bundle_is_refused_at_fetch(
    live: Live, ci_key: KeyPair, tmp_path: Path
) -> None:
    registry = live.server.registry
    registry.add_trust_anchor("acme", "ci", AnchorKind.KEY, ci_key.public_pem, "test")
    registry.set_trust_policy("acme", PolicyKind.SIGNED, [], "test")
    _register_signed(live, ci_key, "signed1", tmp_path)
    demo = live.assets.adapter("acme", "support", "r1")
    api = client(live.url, live.key("acme"))
    done = api.completions.create(
        model="support@signed1", prompt=demo.probe_prompt, temperature=0,
        max_tokens=demo.probe_max_tokens,
    )  # fmt: skip
    assert done.choices[0].text == demo.expected_continuation
    assert done.model_extra is not None
    assert done.model_extra["loraplex"]["revision"] == "acme/support@signed1"

    # A bundle of other content (another adapter's, signed by the same trusted key) replaces the
    # stored bundle object of a revision never loaded yet: its first L3 -> L2 fetch must refuse.
    other = live.assets.adapter("globex", "search", "r2")
    foreign = tmp_path / "foreign"
    shutil.copytree(other.path, foreign)
    sign_dir(foreign, ci_key.private_path)
    third = _fresh_revision(live, ci_key, tmp_path)
    assert third.provenance is not None
    store = registry.store
    assert isinstance(store, LocalArtifactStore)
    shutil.copyfile(foreign / "model.sig", store.path_for(third.provenance.signature_digest))
    with pytest.raises(openai.APIStatusError) as refused:
        api.completions.create(model=f"support@{third.revision}", prompt="x", max_tokens=2)
    assert refused.value.status_code == 500
    assert "could not be loaded" in refused.value.message


def _fresh_revision(live: Live, key: KeyPair, workdir: Path) -> object:
    """A signed revision with bytes no other revision has (so nothing of it is cached yet)."""
    demo = live.assets.adapter("acme", "support", "r1")
    folder = workdir / "fresh"
    shutil.copytree(demo.path, folder)
    config = folder / "adapter_config.json"
    config.write_text(config.read_text() + "\n")
    sign_dir(folder, key.private_path)
    request = RegistrationRequest(folder, "acme", "support", "fresh")
    return live.server.registry.register(request, "test").revision
