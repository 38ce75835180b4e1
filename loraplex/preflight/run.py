"""``preflight``: observe the deployment once, judge every launch item, return the report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from loraplex.preflight import checks_registry as reg
from loraplex.preflight import checks_runtime as rt
from loraplex.preflight.client import Deployment
from loraplex.preflight.load import LoadConfig
from loraplex.preflight.observe import Observation, observe
from loraplex.preflight.report import Report, Verdict


@dataclass(frozen=True)
class PreflightConfig:
    """One preflight run."""

    url: str  # the deployment's base URL (server or fleet ingress)
    admin_key: str  # the admin credential
    tenant_key: str | None = None  # a tenant key for the refusal probes; None: a throwaway one
    rules_text: str | None = None  # Prometheus alert rules the deployment loads, if given
    timeout_s: float = 120.0  # per HTTP request
    load: LoadConfig = field(default_factory=LoadConfig)  # the load test's bounds

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is invalid; expected http:// or https://")
        if not self.admin_key:
            raise ValueError("admin_key is empty; expected the deployment's admin credential")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):  # inf: an unbounded wait
            raise ValueError(f"timeout_s {self.timeout_s} is invalid; expected a finite number > 0")


def judge(obs: Observation, rules_text: str | None) -> tuple[Verdict, ...]:
    """Every item's verdict, in checklist order."""
    return (
        reg.immutable_digests(obs),
        reg.validated_at_registration(obs),
        rt.cache_limits_load_tested(obs),
        rt.tiers_distinguished(obs),
        rt.no_eviction_in_use(obs),
        reg.core_warm_policy(obs),
        reg.tenant_pollution_bounded(obs),
        rt.router_affinity_and_load(obs),
        reg.cache_keys_base_and_revision(obs),
        reg.canary_prewarm_rollback(obs),
        rt.load_unload_not_exposed(obs),
        rt.cold_warm_ttft_separate(obs),
        rt.eviction_alerted(obs, rules_text),
        rt.hot_and_long_tail_load(obs),
    )


def preflight(config: PreflightConfig) -> Report:
    deployment = Deployment(config.url, config.admin_key, config.timeout_s)
    try:
        obs = observe(deployment, config.load, config.tenant_key)
    finally:
        deployment.close()
    facts = {
        "replicas": len(obs.fleet.get("replicas", [])),
        "policy": obs.fleet.get("policy"),
        "load": None if obs.load is None else obs.load.summary(),
    }
    return Report(deployment.url, judge(obs, config.rules_text), facts)
