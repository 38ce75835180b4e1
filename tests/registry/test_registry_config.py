"""Where the registry lives by default, and config validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.registry import LocalArtifactStore, RegistryConfig, default_data_dir, open_store
from loraplex.registry.s3 import S3ArtifactStore
from loraplex.registry.sql.connect import open_database


def test_default_data_dir_precedence() -> None:
    home = Path("/home/u")
    assert default_data_dir({}, home) == home / ".local/share/loraplex"
    assert default_data_dir({"XDG_DATA_HOME": "/x"}, home) == Path("/x/loraplex")
    env = {"XDG_DATA_HOME": "/x", "LORAPLEX_DATA_DIR": "/d"}
    assert default_data_dir(env, home) == Path("/d")


def test_defaults_derive_from_the_data_dir(tmp_path: Path) -> None:
    config = RegistryConfig(tmp_path)
    assert config.database == f"sqlite:///{tmp_path}/registry.sqlite3"
    store = open_store(config)
    assert isinstance(store, LocalArtifactStore)
    assert store.root == (tmp_path / "artifacts").resolve()


def test_s3_store_url_is_split_into_bucket_and_prefix(tmp_path: Path) -> None:
    config = RegistryConfig(tmp_path, store="s3://bucket/a/b", s3_endpoint="http://127.0.0.1:1")
    store = open_store(config)
    assert isinstance(store, S3ArtifactStore)
    assert store.url == "s3://bucket/a/b/"
    assert store.object_key("ab" * 32) == f"a/b/sha256/{'ab' * 32}"


def test_invalid_configs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_lora_rank 0"):
        RegistryConfig(tmp_path, max_lora_rank=0)
    with pytest.raises(ValueError, match="expected an s3:// store"):
        RegistryConfig(tmp_path, s3_endpoint="http://x")
    with pytest.raises(ValueError, match="database url 'mysql://x' is invalid"):
        open_database("mysql://x")
