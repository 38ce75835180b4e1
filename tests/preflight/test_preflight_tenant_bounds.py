"""Item 7 (``tenant_pollution_bounded``) judges each tenant's effective bound per tier: its own
byte cap, else the default share every replica reports in ``GET /admin/fleet``."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.preflight.checks_registry import tenant_pollution_bounded
from loraplex.preflight.client import Answer, Metrics
from loraplex.preflight.observe import Observation, RegistryView
from loraplex.preflight.report import Status

SHARE = 1 << 20


def _replica(l0: int | None, l1: int | None) -> dict[str, Any]:
    tiers = {"l0": {"tenant_default_max_bytes": l0}, "l1": {"tenant_default_max_bytes": l1}}
    return {"replica_id": "r", "tiers": tiers}


def _tenant(name: str, **quotas: int) -> dict[str, Any]:
    return {"name": name, "quotas": quotas}


def _judge(tenants: list[dict[str, Any]], replicas: list[dict[str, Any]]) -> Any:
    obs = Observation(
        registry=RegistryView(tenants, [], False),
        fleet={"policy": None, "replicas": replicas, "decisions": {}},
        releases=Answer("GET", "/admin/releases", 200, []),
        before=Metrics([]), after=Metrics([]), residency={}, refusals=(), load=None,
        load_note="", in_use=None,
    )  # fmt: skip
    return tenant_pollution_bounded(obs)


@pytest.mark.parametrize(
    ("tenant", "replicas", "status"),
    [
        (_tenant("a"), [_replica(SHARE, SHARE)], Status.PASS),  # the default share
        (_tenant("a"), [_replica(None, None)], Status.FAIL),  # share 1.0, no cap
        (_tenant("a"), [], Status.FAIL),  # no replica reports: nothing known
        # one replica without a default (an older server): its tenants can fill it
        (_tenant("a"), [_replica(SHARE, SHARE), _replica(None, None)], Status.FAIL),
        (_tenant("a", max_gpu_bytes=5, max_cpu_bytes=5), [_replica(None, None)], Status.PASS),
        (_tenant("a", max_gpu_bytes=5), [_replica(None, None)], Status.WARN),  # L1 open
        (_tenant("a", max_cpu_bytes=5), [_replica(SHARE, None)], Status.PASS),
        (_tenant("a", max_requests_per_s=3), [_replica(None, None)], Status.WARN),
    ],
)
def test_each_tenant_is_judged_on_its_effective_bound(
    tenant: dict[str, Any], replicas: list[dict[str, Any]], status: Status
) -> None:
    verdict = _judge([tenant], replicas)
    assert verdict.status is status, verdict
    if status is not Status.PASS:
        assert "a" in verdict.summary


def test_the_evidence_names_the_default_share_and_the_tenants_with_their_own_caps() -> None:
    tenants = [_tenant("a"), _tenant("b", max_gpu_bytes=7, max_cpu_bytes=9)]
    verdict = _judge(tenants, [_replica(SHARE, 2 * SHARE), _replica(SHARE // 2, 2 * SHARE)])
    assert verdict.status is Status.PASS
    assert "with a byte cap of their own: b" in verdict.evidence[0]
    # the smallest replica's share is what every tenant may count on
    assert f"GPU tier {SHARE // 2} bytes, of the CPU tier {2 * SHARE} bytes" in verdict.evidence[1]
