"""Server fixtures: one registry with the demo tenants and adapters per session, and a fresh app
on a fake engine per test (the end-to-end tests build their own server on the real engine)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import FakeEngine, null_cache
from fastapi.testclient import TestClient

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.clock import MonotonicClock
from loraplex.demo.assets import DemoAssets
from loraplex.registry import Registry, RegistryConfig, open_registry
from loraplex.release.traffic import ReleaseTraffic
from loraplex.residency.cache import TieredAdapterCache
from loraplex.serve.bootstrap import DemoState, register_demo, sample_keys
from loraplex.serve.local_fleet import LocalFleetState
from loraplex.server.app import create_app
from loraplex.server.chat import ChatTemplate
from loraplex.server.deps import ServerConfig, ServerDeps, untracked_releases

ADMIN_KEY = "test-admin-credential-0123456789"
BASE_NAME = "loraplex-demo-small"


@dataclass(frozen=True)
class Served:
    """A registry holding the demo set, and one key per demo tenant."""

    registry: Registry  # shared by every test of the session
    demo: DemoState  # what was registered
    keys: dict[str, str]  # tenant -> bearer token
    assets: DemoAssets  # the demo files
    import_dir: Path  # the admin import directory (the demo adapters directory)


@pytest.fixture(scope="session")
def served(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("server-registry")
    base = BaseModelSpec.from_dir(demo_assets.base_model_dir)
    registry = open_registry(RegistryConfig(data_dir), base=base)
    demo = register_demo(registry, demo_assets)
    keys = sample_keys(registry, demo.tenants, data_dir)
    yield Served(registry, demo, keys, demo_assets, demo_assets.root / "adapters")
    registry.close()


@dataclass
class Rig:
    """A test client over an app on the fake engine."""

    client: TestClient  # talks to the app in-process
    engine: FakeEngine  # the scripted engine behind it
    served: Served  # the registry and keys
    cache: TieredAdapterCache  # a real cache on a pipeline that moves nothing

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.served.keys[tenant]}"}

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}


def make_app_deps(
    served: Served, engine: FakeEngine, releases: ReleaseTraffic | None = None, **config: object
) -> ServerDeps:
    """An app's deps over the session's registry; ``releases`` carries the server's clock."""
    cache = null_cache()
    vocab_size = BaseModelSpec.from_dir(served.assets.base_model_dir).vocab_size
    settings = ServerConfig(
        base_model_name=BASE_NAME,
        admin_key=ADMIN_KEY,
        import_dir=served.import_dir,
        vocab_size=vocab_size,
        **config,  # type: ignore[arg-type]
    )
    chat = ChatTemplate.from_model_dir(served.assets.base_model_dir)
    fleet = LocalFleetState(engine, cache, MonotonicClock())  # what `loraplex serve` passes
    return ServerDeps(
        settings,
        engine,
        served.registry,
        cache,
        chat,
        refresh_tenants=lambda: None,
        fleet=fleet,
        releases=releases or untracked_releases(),
    )


@pytest.fixture
def rig(served: Served) -> Iterator[Rig]:
    engine = FakeEngine()
    deps = make_app_deps(served, engine)
    assert deps.cache is not None
    with TestClient(create_app(deps)) as client:
        yield Rig(client, engine, served, deps.cache)
    deps.cache.close()
