"""``release rollback`` at any depth: each one undoes the newest promotion still standing, so
after v1 -> v2 -> v3 a second rollback reaches v1 (it used to exit 1: the newest release was
already rolled back); past the last promotion it names ``adapters alias rollback``. ``release
status`` says what a release waits for: a server to move it, traffic to judge a step, a step's
dwell, an operator's ``release promote``."""

from __future__ import annotations

import re
import time

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.registry import Registry, RegistryConfig
from loraplex.release.model import Comparison, ReleasePlan, ReleaseState, RevisionWindow
from loraplex.release.store import ReleaseStore

S = ReleaseState


@pytest.fixture
def run(registry: Registry, registry_config: RegistryConfig):  # type: ignore[no-untyped-def]
    location = ["--data-dir", str(registry_config.data_dir)]
    location += ["--database-url", str(registry_config.database_url)]

    def _run(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, [*args, *location])
        assert result.exit_code == code, result.output
        return result.output

    return _run


def _to_canary(registry: Registry, revision: str) -> None:
    store = ReleaseStore(registry)
    plan = ReleasePlan(ladder=(0.25,), dwell_s=30.0)
    release = store.start_release("acme", "bot", revision, plan, actor="t")
    now = registry.now()
    for to in (S.PREWARMING, S.PROBING):
        release = store.transition(release, to, actor="t", now=now)
    store.transition(release, S.CANARY, actor="t", now=now, step=0)


def _serving(registry: Registry) -> list[str]:
    alias = registry.get_alias("acme", "bot")
    assert alias is not None
    return [t.revision for t in alias.targets]


def test_each_rollback_undoes_the_newest_promotion_still_standing(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    for revision in ("v2", "v3"):
        _to_canary(registry, revision)
        ReleaseStore(registry).promote("acme", "bot", actor="t")
    assert _serving(registry) == ["v3"]

    assert "v2 -> v3\trolled_back" in run("release", "rollback", "acme/bot")
    assert _serving(registry) == ["v2"]
    assert "v1 -> v2\trolled_back" in run("release", "rollback", "acme/bot")
    assert _serving(registry) == ["v1"]

    refused = run("release", "rollback", "acme/bot", code=1)
    # the rollbacks used up the alias's history: no longer sent to an `adapters alias rollback`
    # that fails (it was, in this very case)
    assert "the alias keeps no earlier targets either" in refused
    assert "no rollback target" in run("adapters", "alias", "rollback", "acme/bot", code=1)
    assert _serving(registry) == ["v1"]


def test_a_rollback_in_canary_then_goes_on_to_the_promotion_before(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    _to_canary(registry, "v2")
    ReleaseStore(registry).promote("acme", "bot", actor="t")
    _to_canary(registry, "v3")
    assert "v2 -> v3\trolled_back" in run("release", "rollback", "acme/bot")
    assert _serving(registry) == ["v2"]  # the canary never moved the alias
    assert "v1 -> v2\trolled_back" in run("release", "rollback", "acme/bot")
    assert _serving(registry) == ["v1"]


def test_status_says_what_a_release_waits_for(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    run("release", "start", "acme/bot", "v2", "--share", "25%", "--dwell", "30s")
    staged = run("release", "status", "acme/bot")
    assert "waiting for a server: `loraplex serve` (or a fleet) on this registry" in staged
    assert "(a running one within seconds; `release status` follows it)" in staged
    store = ReleaseStore(registry)
    release = store.latest_release("acme", "bot")
    now = registry.now()
    for to in (S.PREWARMING, S.PROBING):
        release = store.transition(release, to, actor="t", now=now)
    release = store.transition(release, S.CANARY, actor="t", now=now, step=0)
    canary = run("release", "status", "acme/bot")
    assert (
        "waiting for traffic: step 1 passes after 10 candidate requests (0 so far) and 30 s; "
        "25.0% of the callers of acme/bot get the candidate"
    ) in canary
    # three callers, one request each: the step counts 2 (the top caller by successes is left
    # out), the table shows 3; the line said "(2 so far)" alone, read as a miscount
    window = RevisionWindow(requests=3, callers=3, best_caller_requests=1)
    store.save_observation(release, comparison=Comparison(0, now, window, RevisionWindow()))
    observed = run("release", "status", "acme/bot")
    assert "(2 so far of 3, less the top callers by successes/failures) and 30 s" in observed
    assert "v2\tcandidate\t3\t3\t" in observed


def _canary_with_requests(run, registry: Registry, *start: str) -> None:  # type: ignore[no-untyped-def]
    """A release in its first canary step, started now, that has its 10 requests (11 counted:
    12 callers, the top one left out); with ``passed`` as a controller would record it."""
    run("release", "start", "acme/bot", "v2", "--share", "25%", "--dwell", "30s", *start)
    store = ReleaseStore(registry)
    release = store.latest_release("acme", "bot")
    now = time.time()
    for to in (S.PREWARMING, S.PROBING):
        release = store.transition(release, to, actor="t", now=now)
    release = store.transition(release, S.CANARY, actor="t", now=now, step=0, step_started_at=now)
    window = RevisionWindow(requests=12, callers=12, best_caller_requests=1)
    passed = "--no-auto-promote" in start
    comparison = Comparison(0, now, window, RevisionWindow(), passed=passed)
    store.save_observation(release, comparison=comparison)


def test_status_says_a_step_with_its_traffic_waits_for_its_dwell(run, registry: Registry) -> None:  # type: ignore[no-untyped-def]
    """A step with its requests but not its dwell printed no line at all, and read as stuck."""
    _canary_with_requests(run, registry)
    status = run("release", "status", "acme/bot")
    assert "waiting for traffic" not in status
    assert re.search(
        r"waiting for time: step 1 has its 10 candidate requests and passes once it has run "
        r"30 s \(--dwell\), at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \((29|30) s from now\)",
        status,
    ), status


def test_status_says_a_passed_step_without_auto_promote_waits_for_promote(
    run, registry: Registry
) -> None:  # type: ignore[no-untyped-def]
    _canary_with_requests(run, registry, "--no-auto-promote")
    status = run("release", "status", "acme/bot")
    assert (
        "waiting for an operator: step 1 passed and the release was started with "
        "--no-auto-promote; `loraplex release promote acme/bot` promotes it"
    ) in status
    assert "waiting for time" not in status
