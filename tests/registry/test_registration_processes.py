"""Registration across processes: concurrent registrants, and SIGKILL at the worst moments."""

from __future__ import annotations

import multiprocessing
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import registry_kit
from registry_kit import AdapterFactory

from loraplex.errors import AdapterNotFoundError
from loraplex.registry import RegistrationRequest, Registry, RegistryConfig

KIT = Path(registry_kit.__file__)


def _assert_sound(registry: Registry) -> None:
    """No row points at a missing object, and every object a row names reads back verified."""
    assert registry.check_integrity() == []
    for adapter in registry.list_adapters():
        for rev in registry.list_revisions(adapter.tenant, adapter.name):
            for digest in (rev.adapter_digest, rev.config_digest):
                assert b"".join(registry.store.read(digest))


def test_two_processes_register_concurrently(
    registry: Registry,
    registry_config: RegistryConfig,
    model_dir: Path,
    make_adapter: AdapterFactory,
) -> None:
    registry.create_tenant("acme", "ops")
    shared = str(make_adapter("shared", seed=99))
    jobs = []
    for worker in range(2):
        own = [
            (str(make_adapter(f"w{worker}-{i}", seed=10 * worker + i)), "bot", f"w{worker}-v{i}")
            for i in range(3)
        ]
        # Both workers also register the same revision with identical bytes, interleaved.
        jobs.append([own[0], (shared, "bot", "shared"), *own[1:]])
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(
            target=registry_kit.register_many, args=(registry_config, model_dir, job, "acme")
        )
        for job in jobs
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=120)
    assert [process.exitcode for process in workers] == [0, 0]

    revisions = {rev.revision for rev in registry.list_revisions("acme", "bot")}
    assert revisions == {"shared"} | {f"w{w}-v{i}" for w in range(2) for i in range(3)}
    registered = [e for e in registry.audit_log() if e.action == "revision.register"]
    assert len(registered) == 7  # the shared revision is recorded once
    assert sum(bool(e.details["created_adapter"]) for e in registered) == 1
    _assert_sound(registry)


def _spawn_crash_child(
    config: RegistryConfig, model_dir: Path, adapter_dir: Path, marker: Path, stage: str
) -> subprocess.Popen[str]:
    args = [registry_kit.config_json(config), str(model_dir), str(adapter_dir), str(marker), stage]
    return subprocess.Popen(
        [sys.executable, str(KIT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=KIT.parent,
    )


def _wait_for(path: Path, process: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"child exited early with {process.returncode}"
        assert time.monotonic() < deadline, "child never reached the stage"
        time.sleep(0.02)


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


@pytest.mark.usefixtures("store_choice")
@pytest.mark.parametrize("stage", ["objects_stored", "rows_written"])
def test_sigkill_mid_registration_leaves_nothing_half_registered(
    registry: Registry,
    registry_config: RegistryConfig,
    model_dir: Path,
    make_adapter: AdapterFactory,
    tmp_path: Path,
    stage: str,
) -> None:
    registry.create_tenant("acme", "ops")
    adapter_dir = make_adapter("crash")
    marker = tmp_path / "reached"
    child = _spawn_crash_child(registry_config, model_dir, adapter_dir, marker, stage)
    _wait_for(marker, child)
    _kill(child)

    with pytest.raises(AdapterNotFoundError):
        registry.get_revision("acme/crash@v1")
    assert registry.list_adapters() == []
    assert registry.get_alias("acme", "crash") is None
    assert [e.action for e in registry.audit_log()] == ["tenant.create"]
    _assert_sound(registry)
    # The orphaned objects are harmless, and a retry completes the registration.
    result = registry.register(RegistrationRequest(adapter_dir, "acme", "crash", "v1"), "ops")
    assert result.created
    _assert_sound(registry)


def test_sigkill_at_random_moments_never_breaks_invariants(
    registry: Registry,
    registry_config: RegistryConfig,
    model_dir: Path,
    make_adapter: AdapterFactory,
    tmp_path: Path,
) -> None:
    registry.create_tenant("acme", "ops")
    adapter_dir = make_adapter("crash")
    rng = random.Random(1234)
    last = "absent"
    for attempt in range(6):
        child = _spawn_crash_child(
            registry_config, model_dir, adapter_dir, tmp_path / f"m{attempt}", "none"
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.08))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        _assert_sound(registry)
        try:
            rev = registry.get_revision("acme/crash@v1")
        except AdapterNotFoundError:
            continue
        last = "complete"
        assert registry.get_alias("acme", "crash") is not None
        assert (
            b"".join(registry.store.read(rev.adapter_digest))
            == (adapter_dir / "adapter_model.safetensors").read_bytes()
        )
    # Whatever the kills left, a retry ends with the revision registered exactly once.
    result = registry.register(RegistrationRequest(adapter_dir, "acme", "crash", "v1"), "ops")
    assert result.created == (last == "absent")
    registered = [e for e in registry.audit_log() if e.action == "revision.register"]
    assert [e.subject for e in registered] == ["acme/crash@v1"]
    _assert_sound(registry)
