"""Release fixtures: a SQLite registry with one adapter, ``acme/bot``, whose alias points at v1
and which has candidates v2 (probe " world") and v3; a fake ``ReleaseEnv``; a manual clock."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from registry_kit import StepClock, write_adapter, write_base_model

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.registry import (
    RegistrationRequest,
    Registry,
    RegistryConfig,
    open_registry,
)
from loraplex.release.model import RevisionWindow

START_S = 1_800_000_000.0  # the manual clock's epoch seconds


@dataclass
class FakeEnv:
    """Records pins; probes answer from ``outputs``; windows from ``windows``."""

    outputs: dict[tuple[str, str], str] = field(default_factory=dict)  # (revision, prompt)
    load_errors: dict[str, Exception] = field(default_factory=dict)  # revision -> error
    windows: dict[str, RevisionWindow] = field(default_factory=dict)  # revision ref -> window
    pinned: set[str] = field(default_factory=set)  # revision labels currently pinned
    prewarmed: list[tuple[str, bool]] = field(default_factory=list)
    probed: list[tuple[str, str]] = field(default_factory=list)
    window_since: list[float] = field(default_factory=list)
    merged: set[str] = field(default_factory=set)  # revision labels merged into the weights

    def prewarm(self, key: AdapterKey, *, gpu: bool) -> Future[None]:
        self.prewarmed.append((key.revision, gpu))
        done: Future[None] = Future()
        if key.revision in self.load_errors:
            done.set_exception(self.load_errors[key.revision])
        else:
            self.pinned.add(key.revision)
            done.set_result(None)
        return done

    def hold(self, key: AdapterKey) -> None:
        self.pinned.add(key.revision)

    def unhold(self, key: AdapterKey) -> None:
        self.pinned.discard(key.revision)

    def is_merged(self, key: AdapterKey) -> bool:
        return key.revision in self.merged

    def probe(self, key: AdapterKey, tenant: str, prompt: str, max_tokens: int) -> Future[str]:
        self.probed.append((key.revision, prompt))
        done: Future[str] = Future()
        done.set_result(self.outputs.get((key.revision, prompt), ""))
        return done

    def window(self, release_id: str, revision_ref: str, since: float) -> RevisionWindow:
        self.window_since.append(since)
        return self.windows.get(revision_ref, RevisionWindow())


@pytest.fixture
def registry_config(tmp_path: Path) -> RegistryConfig:
    return RegistryConfig(tmp_path / "data", f"sqlite:///{tmp_path / 'registry.sqlite3'}")


@pytest.fixture
def base(tmp_path: Path) -> BaseModelSpec:
    return BaseModelSpec.from_dir(write_base_model(tmp_path / "models"))


@pytest.fixture
def registry(
    registry_config: RegistryConfig, base: BaseModelSpec, tmp_path: Path
) -> Iterator[Registry]:
    reg = open_registry(registry_config, base, wall_clock=StepClock(START_S))
    reg.create_tenant("acme", "ops")
    for seed, revision in enumerate(("v1", "v2", "v3")):
        adapter_dir = write_adapter(tmp_path / "adapters" / revision, base, seed=seed)
        probe = {"probe_prompt": "hello", "expected_continuation": " world"}
        request = RegistrationRequest(adapter_dir, "acme", "bot", revision, **probe)
        reg.register(request, "ops")
    yield reg
    reg.close()


@pytest.fixture
def env() -> FakeEnv:
    """Every revision passes its own probe unless a test says otherwise."""
    outputs = {(rev, "hello"): " world, again" for rev in ("v1", "v2", "v3")}
    return FakeEnv(outputs=outputs)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_S)
