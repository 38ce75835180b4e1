"""Items judged from the registry and the admin API: digests, registration records, warm
policies, tenant quotas, cache identity and the release tools."""

from __future__ import annotations

import re
from typing import Any

from loraplex.preflight.observe import Observation
from loraplex.preflight.report import Status, Verdict

SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_CITED = 5  # most offending records one verdict names


def _ref(revision: dict[str, Any]) -> str:
    return f"{revision['tenant']}/{revision['name']}@{revision['revision']}"


def _cited(refs: list[str]) -> str:
    more = f" and {len(refs) - MAX_CITED} more" if len(refs) > MAX_CITED else ""
    return ", ".join(refs[:MAX_CITED]) + more


def _listing(obs: Observation) -> str:
    reg = obs.registry
    truncated = " (first ones only: the registry holds more)" if reg.truncated else ""
    return (
        f"GET /admin/adapters and /admin/adapters/{{tenant}}/{{name}}: {len(reg.adapters)} "
        f"adapters, {len(reg.revisions())} revisions{truncated}"
    )


def immutable_digests(obs: Observation) -> Verdict:
    item = "immutable_digests"
    revisions = obs.registry.revisions()
    if not revisions:
        return Verdict(item, Status.WARN, "the registry holds no revision", (_listing(obs),))
    bad = [
        _ref(r)
        for r in revisions
        if not (SHA256.match(str(r["adapter_digest"])) and SHA256.match(str(r["config_digest"])))
    ]
    unknown = [
        f"{a['adapter']['tenant']}/{a['adapter']['name']}@{t['revision']}"
        for a in obs.registry.adapters
        if a["alias"] is not None
        for t in a["alias"]["targets"]
        if t["revision"] not in {r["revision"] for r in a["revisions"]}
    ]
    evidence = (_listing(obs), f"revisions without a sha256 content digest: {len(bad)}",
                f"alias targets that are no registered revision: {len(unknown)}")  # fmt: skip
    if bad or unknown:
        why = f"not content-addressed: {_cited(bad + unknown)}"
        return Verdict(item, Status.FAIL, why, evidence)
    return Verdict(item, Status.PASS, "every revision carries sha256 digests", evidence)


def validated_at_registration(obs: Observation) -> Verdict:
    item = "validated_at_registration"
    revisions = obs.registry.revisions()
    if not revisions:
        return Verdict(item, Status.WARN, "the registry holds no revision", (_listing(obs),))
    bad = [
        _ref(r)
        for r in revisions
        if not (
            int(r["max_rank"]) >= 1
            and r["dtype"]
            and r["target_modules"]
            and int(r["compat_version"]) >= 1
            and int(r["estimated_bytes"]) > 0
        )
    ]
    ranks = sorted({int(r["max_rank"]) for r in revisions})
    evidence = (_listing(obs), f"ranks recorded: {ranks}",
                f"dtypes recorded: {sorted({str(r['dtype']) for r in revisions})}",
                f"revisions missing rank, dtype, target modules or size: {len(bad)}")  # fmt: skip
    if bad:
        return Verdict(item, Status.FAIL, f"no validation record: {_cited(bad)}", evidence)
    why = "every revision records its validated rank, dtype, target modules and size"
    return Verdict(item, Status.PASS, why, evidence)


def _hottest(ranked: list[dict[str, Any]]) -> list[str]:
    """Adapters requested at least half as often as the most requested one (at most four)."""
    if not ranked:
        return []
    bar = ranked[0]["hits"] / 2
    hot = [h["model"].partition("@")[0] for h in ranked if h["hits"] >= bar and h["hits"] > 0]
    return list(dict.fromkeys(hot))[:4]


def core_warm_policy(obs: Observation) -> Verdict:
    item = "core_warm_policy"
    core = obs.registry.core_models()
    pinned = sorted({e["model"] for e in obs.residency.get("entries", []) if e.get("pinned")})
    hot = _hottest(obs.residency.get("hot", []))
    evidence = (
        f"revisions with a gpu or cpu warm_policy: {_cited(core) or 'none'}",
        f"pinned copies (GET /admin/residency): {_cited(pinned) or 'none'}",
        f"most requested adapters after the load test: {hot or 'none'}",
    )
    covered = set(core) | {p.partition("@")[0] for p in pinned}
    if not covered:
        why = "no revision has a gpu/cpu warm policy and no copy is pinned"
        return Verdict(item, Status.FAIL, why, evidence)
    uncovered = [m for m in hot if m not in covered]
    if uncovered:
        why = f"most requested adapters without a warm policy or pin: {_cited(uncovered)}"
        return Verdict(item, Status.WARN, why, evidence)
    return Verdict(item, Status.PASS, f"{len(covered)} core adapters warm or pinned", evidence)


def _default_shares(obs: Observation) -> dict[str, int | None]:
    """Per tier (``l0``, ``l1``), the bytes every tenant keeps against the others on every
    replica (``GET /admin/fleet``: the servers' default share, work-conserving: a tenant may
    borrow free room beyond it, never another tenant's copies within it); None where a replica
    has none (one tenant's loads may evict every other's copies there) or no replica reports."""
    replicas = obs.fleet.get("replicas", [])
    shares: dict[str, int | None] = {}
    for tier in ("l0", "l1"):
        caps = [r.get("tiers", {}).get(tier, {}).get("tenant_default_max_bytes") for r in replicas]
        known = [int(c) for c in caps if c is not None]
        shares[tier] = min(known) if known and len(known) == len(caps) else None
    return shares


def _bounds(quotas: dict[str, Any], shares: dict[str, int | None]) -> dict[str, str | None]:
    """Per tier, what bounds a tenant's residency there, in words; None: nothing."""
    bounds: dict[str, str | None] = {}
    for tier, field in (("l0", "max_gpu_bytes"), ("l1", "max_cpu_bytes")):
        own, share = quotas.get(field), shares[tier]
        bounds[tier] = (
            f"{field} {own}" if own is not None
            else None if share is None else f"default share {share} bytes"
        )  # fmt: skip
    return bounds


def tenant_pollution_bounded(obs: Observation) -> Verdict:
    item = "tenant_pollution_bounded"
    tenants = obs.registry.tenants
    shares = _default_shares(obs)
    unbounded: list[str] = []
    rate_only: list[str] = []
    one_tier: list[str] = []
    for tenant in tenants:
        bounds = _bounds(tenant["quotas"], shares)
        if all(bounds.values()):
            continue
        if any(bounds.values()):
            one_tier.append(tenant["name"])
        elif tenant["quotas"].get("max_requests_per_s") is not None:
            rate_only.append(tenant["name"])
        else:
            unbounded.append(tenant["name"])
    evidence = (
        f"GET /admin/tenants: {len(tenants)} tenants; {_explicit(tenants)}",
        f"GET /admin/fleet: default per-tenant share of the GPU tier {shares['l0']} bytes, of "
        f"the CPU tier {shares['l1']} bytes (None: no share, one tenant may evict the others)",
        f"bounded in neither tier, nor by rate: {_cited(unbounded) or 'none'}",
        f"bounded by request rate only: {_cited(rate_only) or 'none'}",
        f"bounded in one of the GPU and CPU tiers only: {_cited(one_tier) or 'none'}",
    )
    if unbounded:
        why = f"tenants that can fill the cache without bound: {_cited(unbounded)}"
        return Verdict(item, Status.FAIL, why, evidence)
    if rate_only or one_tier:
        why = f"residency not bounded in every tier: {_cited(rate_only + one_tier)}"
        return Verdict(item, Status.WARN, why, evidence)
    why = "every tenant's GPU and CPU residency is bounded (its own cap or the default share)"
    return Verdict(item, Status.PASS, why, evidence)


def _explicit(tenants: list[dict[str, Any]]) -> str:
    named = [
        t["name"] for t in tenants
        if t["quotas"].get("max_gpu_bytes") is not None
        or t["quotas"].get("max_cpu_bytes") is not None
    ]  # fmt: skip
    return f"with a byte cap of their own: {_cited(named) or 'none'}"


def cache_keys_base_and_revision(obs: Observation) -> Verdict:
    item = "cache_keys_base_and_revision"
    revisions = obs.registry.revisions()
    no_base = [_ref(r) for r in revisions if not SHA256.match(str(r["base_digest"]))]
    entries = obs.residency.get("entries", [])
    unkeyed = [
        str(e.get("model")) for e in entries
        if "@" not in str(e.get("model")) or not SHA256.match(str(e.get("adapter_digest")))
    ]  # fmt: skip
    mismatches = obs.load.mismatches() if obs.load is not None else []
    evidence = (
        f"{_listing(obs)}; base digests: {len({r['base_digest'] for r in revisions})} distinct",
        f"GET /admin/residency: {len(entries)} copies, {len(unkeyed)} not keyed by revision+digest",
        f"load-test answers naming a revision or digest the registry does not: {len(mismatches)}",
    )
    if no_base or unkeyed or mismatches:
        why = f"identity incomplete: {_cited(no_base + unkeyed + mismatches)}"
        return Verdict(item, Status.FAIL, why, evidence)
    if not entries:
        return Verdict(item, Status.WARN, "no cached copy to inspect", evidence)
    why = "copies are keyed by revision and digest; revisions record their base model"
    return Verdict(item, Status.PASS, why, evidence)


def canary_prewarm_rollback(obs: Observation) -> Verdict:
    item = "canary_prewarm_rollback"
    answer = obs.releases
    rollbacks = sum(
        1 for a in obs.registry.adapters if a["alias"] and a["alias"]["rollback_targets"]
    )
    split = sum(1 for a in obs.registry.adapters if a["alias"] and len(a["alias"]["targets"]) > 1)
    evidence = (
        f"{answer.cite()} (the release controller: canary share, pre-warm, probe, rollback)",
        f"aliases with a rollback target: {rollbacks}; aliases split across revisions: {split}",
    )
    if answer.status == 404:
        return Verdict(item, Status.FAIL, "no release API on this deployment", evidence)
    if not answer.ok():
        why = f"the release API answered {answer.status}: cannot tell"
        return Verdict(item, Status.WARN, why, evidence)
    return Verdict(item, Status.PASS, "the release API answers", evidence)
