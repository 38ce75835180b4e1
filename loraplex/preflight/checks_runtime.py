"""Items judged from behaviour and metrics: the load test, the cache limits it met, the
metrics that tell tiers and cold starts apart, eviction of a copy in use, the router, the
refusal of operator routes to tenants, and the alert rules on evictions."""

from __future__ import annotations

from loraplex.preflight.client import Metrics
from loraplex.preflight.observe import Observation
from loraplex.preflight.report import Status, Verdict

TIERS = ("L0", "L1", "L2")
REFUSED = (401, 403, 404)  # what an operator route may answer a tenant (404: not on this port)
AFFINITY_AND_LOAD = ("affinity_until_saturated",)  # policies weighing both
ALERTED_METRICS = ("adapter_evictions_total", "adapter_reload_after_eviction_total")


def _max_loras(metrics: Metrics) -> int | None:
    values = metrics.label_values("vllm:lora_requests_info", "max_lora")
    return max(int(v) for v in values) if values else None


def _largest_rank(obs: Observation) -> int | None:
    ranks = [int(r["max_rank"]) for r in obs.registry.revisions()]
    return max(ranks) if ranks else None


def _host_memory(obs: Observation) -> str:
    """The CPU tier's capacity (every replica's) against the bytes of the adapters served."""
    capacity = sum(
        int(r.get("tiers", {}).get("l1", {}).get("capacity_bytes", 0))
        for r in obs.fleet.get("replicas", [])
    )
    served = sum(
        int(r["estimated_bytes"])
        for a in obs.registry.adapters
        if a["alias"] is not None
        for r in a["revisions"]
        if r["revision"] in {t["revision"] for t in a["alias"]["targets"]}
    )
    return f"CPU tier capacity {capacity} bytes (GET /admin/fleet); served adapters: {served} bytes"


def _delta(obs: Observation, name: str, **labels: str) -> float | None:
    after = obs.after.total(name, **labels)
    if after is None:
        return None
    return after - (obs.before.total(name, **labels) or 0.0)


def cache_limits_load_tested(obs: Observation) -> Verdict:
    item = "cache_limits_load_tested"
    load = obs.load
    if load is None:
        return Verdict(item, Status.WARN, f"no load test: {obs.load_note}", ())
    max_loras = _max_loras(obs.after)
    distinct = load.distinct_models()
    failed = load.failed()
    evictions = _delta(obs, "adapter_evictions_total")
    gpu_evictions = _delta(obs, "adapter_evictions_total", tier="L0")
    evidence = (
        f"load test: {load.summary()}",
        f"vllm:lora_requests_info max_lora={max_loras}",
        _host_memory(obs),
        f"largest registered rank {_largest_rank(obs)} (registration refuses ranks above "
        "max_lora_rank)",
        f"adapter_evictions_total rose by {evictions} (L0: {gpu_evictions})",
        *(f"{o.model}: {o.status} {o.error}" for o in failed[:3]),
    )
    if failed:
        why = f"{len(failed)} of {len(load.outcomes)} load-test requests failed at these limits"
        return Verdict(item, Status.FAIL, why, evidence)
    # NOTE: whether the load test met the GPU slots' limit is read from the GPU evictions it
    # made, where they are exported: on a fleet ``max_lora`` is every replica's slots summed,
    # while one replica fills its own (a revision may take a slot on several), so "the mix fits
    # in max_loras: no eviction met" was said with evictions made (docs/benchmarks/newop3.md)
    if gpu_evictions is not None and gpu_evictions > 0:
        why = (
            f"{distinct} adapters served without a failure; the load test made "
            f"{gpu_evictions:.0f} GPU evictions"
        )
        return Verdict(item, Status.PASS, why, evidence)
    if max_loras is None:
        return Verdict(item, Status.WARN, "max_lora not exported: limits unknown", evidence)
    if gpu_evictions is not None or distinct <= max_loras:
        why = (
            f"the load test ({distinct} adapters, max_loras {max_loras}) made no GPU eviction: "
            "the GPU slots' limit was not met"
        )
        return Verdict(item, Status.WARN, why, evidence)
    why = f"{distinct} adapters over {max_loras} GPU slots served without a failure"
    return Verdict(item, Status.PASS, why, evidence)


def tiers_distinguished(obs: Observation) -> Verdict:
    item = "tiers_distinguished"
    found = obs.after.label_values("adapter_cache_hits_total", "tier")
    misses = obs.after.total("adapter_cache_misses_total")
    moved = {t: _delta(obs, "adapter_cache_hits_total", tier=t) for t in TIERS}
    evidence = (
        f"adapter_cache_hits_total tiers: {sorted(found)}; rise during the load test: {moved}",
        f"adapter_cache_misses_total (remote fetches): {misses}",
    )
    missing = [t for t in TIERS if t not in found]
    if missing or misses is None:
        why = f"not told apart in /metrics: {missing + ([] if misses is not None else ['miss'])}"
        return Verdict(item, Status.FAIL, why, evidence)
    why = "GPU, CPU, disk hits and misses are separate series"
    return Verdict(item, Status.PASS, why, evidence)


def no_eviction_in_use(obs: Observation) -> Verdict:
    item = "no_eviction_in_use"
    probe = obs.in_use
    if probe is None or probe.evict_answer is None:
        why = "no stream to hold an adapter in use: not judged"
        if probe is not None:  # why it held none: a refusal's status and Retry-After
            why = f"{why} ({probe.note})"
        return Verdict(item, Status.WARN, why, () if probe is None else (probe.note,))
    answer, copy = probe.evict_answer, probe.copy
    held = "not listed" if copy is None else f"pinned {copy['pinned']}, refcount {copy['refcount']}"
    evidence = (
        f"streamed {probe.model}; during it {answer.cite()}: {answer.body}",
        f"its GPU copy then (GET /admin/residency): {held}",
        f"stream: status {probe.stream_status}, {probe.note}",
    )
    evicted = isinstance(answer.body, dict) and answer.body.get("evicted") is True
    if evicted or not probe.stream_complete:
        why = "the GPU copy of a revision in use was evicted" if evicted else probe.note
        return Verdict(item, Status.FAIL, why, evidence)
    if not answer.ok():
        return Verdict(item, Status.WARN, "the eviction attempt was not answered", evidence)
    if copy is not None and copy["pinned"]:
        why = "the copy was pinned: its refusal says nothing of copies in use"
        return Verdict(item, Status.WARN, why, evidence)
    return Verdict(item, Status.PASS, "eviction of the in-use copy was refused", evidence)


def router_affinity_and_load(obs: Observation) -> Verdict:
    item = "router_affinity_and_load"
    policy = obs.fleet.get("policy")
    replicas = obs.fleet.get("replicas", [])
    decisions = obs.fleet.get("decisions", {})
    answered = 0 if obs.load is None else sum(1 for o in obs.load.outcomes if o.status == 200)
    evidence = (
        f"GET /admin/fleet after the load test: policy {policy}, {len(replicas)} replicas, "
        f"decisions {decisions}; load requests answered: {answered}",
    )
    if policy is None:
        return Verdict(item, Status.WARN, "one server: there is no router to judge", evidence)
    if policy not in AFFINITY_AND_LOAD:
        why = f"routing policy {policy!r} does not weigh both affinity and load"
        return Verdict(item, Status.FAIL, why, evidence)
    if answered and not sum(decisions.values()):
        why = f"the router counted no decisions although {answered} load requests were answered"
        return Verdict(item, Status.FAIL, why, evidence)
    return Verdict(item, Status.PASS, f"routing policy {policy}", evidence)


def load_unload_not_exposed(obs: Observation) -> Verdict:
    item = "load_unload_not_exposed"
    evidence = tuple(f"{a.cite()} ({who})" for who, a in obs.refusals)
    open_routes = [f"{a.cite()} ({who})" for who, a in obs.refusals if a.status not in REFUSED]
    if open_routes:
        why = f"operator routes not refused to a tenant: {', '.join(open_routes)}"
        return Verdict(item, Status.FAIL, why, evidence)
    return Verdict(item, Status.PASS, "load, unload and admin calls refused to tenants", evidence)


def cold_warm_ttft_separate(obs: Observation) -> Verdict:
    item = "cold_warm_ttft_separate"
    name = "request_ttft_seconds_count"
    labels = obs.after.label_values(name, "cold")
    counts = {v: obs.after.total(name, cold=v) for v in sorted(labels)}
    evidence = (f"{name} by cold label: {counts}",)
    if not obs.after.named(name):
        return Verdict(item, Status.FAIL, "no TTFT histogram in /metrics", evidence)
    if not labels:
        return Verdict(item, Status.FAIL, "TTFT is not split by cold/warm", evidence)
    missing = [v for v in ("true", "false") if not counts.get(v)]
    if missing:
        why = f"no {'/'.join(missing)} TTFT observed after the load test"
        return Verdict(item, Status.WARN, why, evidence)
    return Verdict(item, Status.PASS, "cold and warm TTFT are separate series", evidence)


def eviction_alerted(obs: Observation, rules_text: str | None) -> Verdict:
    item = "eviction_alerted"
    present = {m: obs.after.total(m) for m in ALERTED_METRICS}
    evidence = [f"/metrics: {present}"]
    missing = [m for m, value in present.items() if value is None]
    if missing:
        return Verdict(item, Status.FAIL, f"not exported: {missing}", tuple(evidence))
    if rules_text is None:
        why = "the series exist; whether a rule alerts on them is outside the server (--rules)"
        return Verdict(item, Status.WARN, why, tuple(evidence))
    # NOTE: a rule may read the counter through rate() on the name with or without _total
    names = [m.removesuffix("_total") for m in ALERTED_METRICS]
    unruled = [m for m in names if m not in rules_text]
    evidence.append(f"--rules file: rules on {[m for m in names if m not in unruled]}")
    if unruled:
        return Verdict(item, Status.FAIL, f"no alert rule on {unruled}", tuple(evidence))
    return Verdict(item, Status.PASS, "alert rules read both series", tuple(evidence))


def hot_and_long_tail_load(obs: Observation) -> Verdict:
    item = "hot_and_long_tail_load"
    load = obs.load
    if load is None:
        return Verdict(item, Status.WARN, f"no load test: {obs.load_note}", ())
    summary = load.summary()
    mismatches = load.mismatches()
    failed = load.failed()
    evidence = (f"load test: {summary}", f"keys: {obs.load_note}", *mismatches[:3])
    if mismatches or failed:
        why = f"{len(failed)} failed and {len(mismatches)} wrong-revision answers"
        return Verdict(item, Status.FAIL, why, evidence)
    if not load.tail:
        why = "no long tail: every registered adapter is in the hot set"
        return Verdict(item, Status.WARN, why, evidence)
    tail_answered = sum(1 for o in load.outcomes if o.phase == "tail")
    if tail_answered < len(load.tail):
        why = f"the request budget ended before the burst: {tail_answered} of {len(load.tail)}"
        return Verdict(item, Status.WARN, why, evidence)
    why = f"{len(load.hot)} hot adapters plus a burst over {len(load.tail)} tail adapters"
    return Verdict(item, Status.PASS, why, evidence)
