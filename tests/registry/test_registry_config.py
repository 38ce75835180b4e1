"""Where the registry lives by default, and config validation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loraplex.registry import LocalArtifactStore, RegistryConfig, default_data_dir, open_store
from loraplex.registry.s3 import S3ArtifactStore
from loraplex.registry.sql.connect import open_database
from loraplex.registry.sql.timeouts import DatabaseTimeouts, database_timeouts
from loraplex.serve.config import ServeConfig
from loraplex.serve.config.file import merge, read_config_file
from loraplex.serve.engine_settings import registry_config


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


@pytest.mark.parametrize(
    ("endpoint", "shown"),
    [
        ("ftp://minio:9000", "'ftp://minio:9000'"),
        ("minio:9000", "'minio:9000'"),
        ("http://", "'http://'"),
        ("http://minio:99999", "'http://minio:99999'"),
        ("http://key:secret@minio:9000", "with credentials"),  # the secret is not shown
    ],
)
def test_an_s3_endpoint_other_than_an_http_url_is_refused_naming_it(
    tmp_path: Path, endpoint: str, shown: str
) -> None:
    """smallfix noticed: any string went to boto3, which refused it at the store's first use."""
    with pytest.raises(ValueError, match=r"^s3_endpoint (.+) is invalid; expected http") as refused:
        RegistryConfig(tmp_path, store="s3://bucket/p", s3_endpoint=endpoint)
    assert str(refused.value).startswith(f"s3_endpoint {shown} is invalid")
    assert "secret" not in str(refused.value)
    RegistryConfig(tmp_path, store="s3://bucket/p", s3_endpoint="https://s3.example:443/")


# --- PostgreSQL timeouts (registry/sql/timeouts.py) ---------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"connect_timeout_s": 1}, "database_connect_timeout_s 1 is invalid; expected whole"),
        ({"connect_timeout_s": 2.5}, "database_connect_timeout_s 2.5 is invalid; expected whole"),
        ({"statement_timeout_s": 0}, "database_statement_timeout_s 0 is invalid"),
        ({"statement_timeout_s": -1.0}, "database_statement_timeout_s -1.0 is invalid"),
        ({"statement_timeout_s": float("nan")}, "database_statement_timeout_s nan is invalid"),
        ({"statement_timeout_s": float("inf")}, "database_statement_timeout_s inf is invalid"),
        ({"statement_timeout_s": 1e9}, "database_statement_timeout_s 1000000000.0 is invalid"),
        ({"lock_timeout_s": 0.0}, "database_lock_timeout_s 0.0 is invalid"),
        ({"lock_timeout_s": True}, "database_lock_timeout_s True is invalid; expected a number"),
        ({"lock_timeout_s": 20.0}, "database_lock_timeout_s 20.0 is invalid; expected <= "),
    ],
)
def test_invalid_database_timeouts_are_refused_naming_the_key(
    values: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DatabaseTimeouts(**values)


def test_unset_timeouts_take_the_defaults_the_lock_one_within_the_statement_one() -> None:
    assert database_timeouts(None, None, None) == DatabaseTimeouts(5, 10.0, 5.0)
    assert database_timeouts(None, 2.0, None) == DatabaseTimeouts(5, 2.0, 2.0)
    assert database_timeouts(3, 4.0, 0.5) == DatabaseTimeouts(3, 4.0, 0.5)
    assert DatabaseTimeouts(5, 10.0, 5.0).client_wait_s == 12.0


def test_timeouts_are_refused_with_a_sqlite_registry(tmp_path: Path) -> None:
    assert RegistryConfig(tmp_path).timeouts() is None
    for key in (
        "database_connect_timeout_s",
        "database_statement_timeout_s",
        "database_lock_timeout_s",
    ):
        with pytest.raises(ValueError, match=f"{key} 3 is invalid with a SQLite registry"):
            RegistryConfig(tmp_path, **{key: 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="database timeouts are invalid with 'sqlite:///x'"):
        open_database("sqlite:///x", DatabaseTimeouts())


def test_timeouts_of_a_postgres_registry(tmp_path: Path) -> None:
    url = "postgresql://u@127.0.0.1:1/db"
    assert RegistryConfig(tmp_path, url).timeouts() == DatabaseTimeouts()
    config = RegistryConfig(tmp_path, url, database_statement_timeout_s=3.0)
    assert config.timeouts() == DatabaseTimeouts(5, 3.0, 3.0)
    with pytest.raises(ValueError, match=r"database_lock_timeout_s 4\.0 is invalid"):
        RegistryConfig(tmp_path, url, database_statement_timeout_s=3.0, database_lock_timeout_s=4.0)


def test_serve_config_keys_reach_the_registry_and_are_checked(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text(
        "[serve]\n"
        'database_url = "postgresql://u@127.0.0.1:1/db"\n'
        "database_connect_timeout_s = 3\n"
        "database_statement_timeout_s = 4\n"
        "database_lock_timeout_s = 0.5\n"
    )
    settings = merge(read_config_file(toml), {"data_dir": tmp_path})
    assert registry_config(settings).timeouts() == DatabaseTimeouts(3, 4, 0.5)
    with pytest.raises(ValueError, match=r"database_lock_timeout_s 9\.0 is invalid"):
        ServeConfig(tmp_path, database_statement_timeout_s=3.0, database_lock_timeout_s=9.0)
    with pytest.raises(ValueError, match="database_connect_timeout_s nan is invalid"):
        ServeConfig(tmp_path, database_connect_timeout_s=float("nan"))
    sqlite_settings = ServeConfig(tmp_path, database_lock_timeout_s=1.0)  # no database known yet
    with pytest.raises(ValueError, match=r"database_lock_timeout_s 1\.0 is invalid with a SQLite"):
        registry_config(sqlite_settings)


# --- PostgreSQL pool size (database_pool_size) --------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 65, True, 2.0, "4"])
def test_an_invalid_pool_size_is_refused_naming_the_key(tmp_path: Path, value: object) -> None:
    url = "postgresql://u@127.0.0.1:1/db"
    message = f"database_pool_size {value!r} is invalid; expected a whole number 1 to 64"
    with pytest.raises(ValueError, match=re.escape(message)):
        RegistryConfig(tmp_path, url, database_pool_size=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape(message)):
        ServeConfig(tmp_path, database_pool_size=value)  # type: ignore[arg-type]


def test_the_pool_size_is_refused_with_a_sqlite_registry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="database_pool_size 2 is invalid with a SQLite registry"):
        RegistryConfig(tmp_path, database_pool_size=2)
    with pytest.raises(ValueError, match="database_pool_size is invalid with 'sqlite:///x'"):
        open_database("sqlite:///x", pool_size=2)


def test_the_serve_key_reaches_the_registry(tmp_path: Path) -> None:
    toml = tmp_path / "serve.toml"
    toml.write_text(
        '[serve]\ndatabase_url = "postgresql://u@127.0.0.1:1/db"\ndatabase_pool_size = 7\n'
    )
    settings = merge(read_config_file(toml), {"data_dir": tmp_path})
    assert registry_config(settings).database_pool_size == 7
    assert RegistryConfig(tmp_path, "postgresql://u@127.0.0.1:1/db").database_pool_size is None
