"""Registry fixtures: both databases (SQLite file, PostgreSQL server) and both artifact stores
(local directory, S3 API served by moto).

PostgreSQL: ``LORAPLEX_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``);
one database per test session, one schema per test. moto: a ThreadedMotoServer on a free port,
one bucket per test. Unreachable servers skip locally and FAIL when ``CI=true``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import pytest
from registry_kit import (
    AdapterFactory,
    OpenRegistry,
    S3Target,
    StepClock,
    write_adapter,
    write_base_model,
)

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.registry import Registry, RegistryConfig, open_registry

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: these tests must run in CI)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str | None]:
    """A fresh database for this session on the test server; None when unreachable."""
    try:
        import psycopg
    except ImportError:
        yield None
        return
    server = os.environ.get("LORAPLEX_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    name = f"loraplex_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(server, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        yield None
        return
    with admin:
        admin.execute(f"CREATE DATABASE {name}")
        try:
            yield urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def postgres_url(postgres_database: str | None) -> Iterator[str]:
    """A URL whose connections use a fresh schema of the session database."""
    if postgres_database is None:
        server = os.environ.get("LORAPLEX_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
        _unavailable(f"no PostgreSQL server reachable at {server} (or psycopg missing)")
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in postgres_database else "?"
    yield f"{postgres_database}{separator}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str | None]:
    """An S3 API endpoint (moto server mode) on 127.0.0.1; None when moto is missing."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_target(moto_endpoint: str | None) -> S3Target:
    if moto_endpoint is None:
        _unavailable("moto[server] is not installed; S3 store tests need its server mode")
    import boto3  # type: ignore[import-untyped]

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    bucket = f"loraplex-{secrets.token_hex(6)}"
    client.create_bucket(Bucket=bucket)
    return S3Target(moto_endpoint, bucket, client)


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture(params=["local", "s3"])
def store_choice(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def registry_config(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str
) -> RegistryConfig:
    """Database from ``database_url``; store local unless the test also uses ``store_choice``."""
    data_dir = tmp_path / "data"
    if "store_choice" in request.fixturenames and request.getfixturevalue("store_choice") == "s3":
        target: S3Target = request.getfixturevalue("s3_target")
        return RegistryConfig(
            data_dir, database_url, f"s3://{target.bucket}/pfx", s3_endpoint=target.endpoint
        )
    return RegistryConfig(data_dir, database_url)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_base_model(tmp_path / "models")


@pytest.fixture
def base(model_dir: Path) -> BaseModelSpec:
    return BaseModelSpec.from_dir(model_dir)


@pytest.fixture
def open_reg(registry_config: RegistryConfig, base: BaseModelSpec) -> Iterator[OpenRegistry]:
    """Opens registries on the test's database and store (several = several processes' view)."""
    opened: list[Registry] = []

    def _open(**overrides: Any) -> Registry:
        kwargs: dict[str, Any] = {"base": base, "wall_clock": StepClock()}
        kwargs.update(overrides)
        registry = open_registry(registry_config, **kwargs)
        opened.append(registry)
        return registry

    yield _open
    for registry in opened:
        registry.close()


@pytest.fixture
def registry(open_reg: OpenRegistry) -> Registry:
    return open_reg()


@pytest.fixture
def make_adapter(tmp_path: Path, base: BaseModelSpec) -> AdapterFactory:
    """``make_adapter("name", seed=0, rank=4, ...)`` -> a fresh adapter directory."""

    def _make(label: str, **kwargs: Any) -> Path:
        return write_adapter(tmp_path / "adapters" / label, base, **kwargs)

    return _make
