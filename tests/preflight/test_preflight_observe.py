"""What ``observe`` reads when: the load test's counters must not include the evictions the
in-use probe makes on purpose (docs/benchmarks/newop3.md: on a 3-replica fleet, item 3 said
"no eviction met" beside "adapter_evictions_total rose by 2.0", both of the probe's)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from loraplex.preflight import observe as observe_module
from loraplex.preflight.checks_runtime import cache_limits_load_tested
from loraplex.preflight.client import Answer, Metrics, Sample
from loraplex.preflight.load import LoadResult, Outcome, Target
from loraplex.preflight.observe import InUseProbe, RegistryView, observe
from loraplex.preflight.report import Status


class FakeDeployment:
    """Counts the GPU evictions made through it; ``/metrics`` reports them."""

    def __init__(self) -> None:
        self.evictions = 0

    def admin(self, method: str, path: str, body: Any = None) -> Answer:
        return Answer(method, path, 200, [])

    def admin_json(self, path: str) -> dict[str, Any]:
        return {"replicas": [], "decisions": {}}

    def metrics(self) -> Metrics:
        return Metrics([Sample("adapter_evictions_total", {"tier": "L0"}, self.evictions)])


def test_the_in_use_probes_evictions_are_not_the_load_tests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployment = FakeDeployment()
    target = Target("acme/support", "key", {"acme/support@r1": "d1"})
    outcome = Outcome("acme/support", "hot", 200, 0.1, "acme/support@r1", "d1", None)
    loaded = LoadResult((outcome,), (target,), (), 1.0)

    def probe(dep: FakeDeployment, target: Target) -> InUseProbe:
        dep.evictions += 2  # every GPU copy of the probed revision, evicted first
        return InUseProbe("acme/support@r1", None, None, 200, True, "stream ran to [DONE]")

    @contextmanager
    def keys(*args: Any) -> Iterator[tuple[dict[str, str], str]]:
        yield {"acme": "key"}, "throwaway keys"

    adapter = {"adapter": {"tenant": "acme"}, "alias": None, "revisions": []}
    registry = RegistryView([], [adapter], False)
    monkeypatch.setattr(observe_module, "read_registry", lambda dep: registry)
    monkeypatch.setattr(observe_module, "load_keys", keys)
    monkeypatch.setattr(observe_module, "refusal_probes", lambda *args: ())
    monkeypatch.setattr(observe_module, "targets", lambda *args: ([target], [], []))
    monkeypatch.setattr(observe_module, "run_load", lambda *args: loaded)
    monkeypatch.setattr(observe_module, "in_use_probe", probe)

    obs = observe(deployment, None, None, settle_s=0.0)  # type: ignore[arg-type]
    assert deployment.evictions == 2  # the probe ran
    verdict = cache_limits_load_tested(obs)
    assert "adapter_evictions_total rose by 0.0 (L0: 0.0)" in verdict.evidence
    assert verdict.summary == "max_lora not exported: limits unknown"  # the fake exports none

    # a fleet's max_lora is every replica's slots summed (24 here), while one replica fills its
    # own: the GPU evictions the load test made, not the mix against that sum, say it met them
    # (main said "the mix (1 adapters) fits in max_loras 24: no eviction met" beside them)
    slots = Sample("vllm:lora_requests_info", {"max_lora": "24"}, 1.0)
    before = Metrics([slots, Sample("adapter_evictions_total", {"tier": "L0"}, 0.0)])
    after = Metrics([slots, Sample("adapter_evictions_total", {"tier": "L0"}, 3.0)])
    met = cache_limits_load_tested(replace(obs, before=before, after=after))
    assert met.status is Status.PASS, met
    assert met.summary == "1 adapters served without a failure; the load test made 3 GPU evictions"
    unmet = cache_limits_load_tested(replace(obs, before=before, after=before))
    assert unmet.status is Status.WARN and "made no GPU eviction" in unmet.summary
