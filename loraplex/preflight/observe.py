"""What the preflight gathers from a running deployment before judging anything: the registry
(through the admin API), the fleet view, ``/metrics`` before and after the load test, refusal
probes with a tenant key, the load test, and an eviction attempt on a copy in use.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from loraplex.preflight.client import (
    MAX_LISTED,
    Answer,
    Deployment,
    KeyIssueError,
    Metrics,
    PreflightError,
)
from loraplex.preflight.load import PROMPT, LoadConfig, LoadResult, Target, run_load

CORE_WARM_POLICIES = ("gpu", "cpu")
MAX_HOT = 4  # most adapters the hot traffic spreads over
MAX_TAIL = 256  # most adapters the long-tail burst touches
# tokens of the stream whose adapter the eviction attempt targets: enough that the stream is
# still running when the attempt and the residency read are answered
PROBE_TOKENS = 200


@dataclass(frozen=True)
class RegistryView:
    """The registry as the admin API lists it."""

    tenants: list[dict[str, Any]]  # ``GET /admin/tenants`` (page by page, at most MAX_LISTED)
    adapters: list[
        dict[str, Any]
    ]  # ``GET /admin/adapters/{tenant}/{name}`` of each, every revision
    truncated: bool  # more adapters than ``MAX_LISTED``: only the first were read

    def revisions(self) -> list[dict[str, Any]]:
        return [r for a in self.adapters for r in a["revisions"]]

    def core_models(self) -> list[str]:
        """Adapters with a revision the operator gave a warm policy (gpu or cpu)."""
        return [
            f"{a['adapter']['tenant']}/{a['adapter']['name']}"
            for a in self.adapters
            if any(r["warm_policy"] in CORE_WARM_POLICIES for r in a["revisions"])
        ]


@dataclass(frozen=True)
class InUseProbe:
    """An eviction attempt on the GPU copy of an adapter while a stream of it is running."""

    model: str  # the revision streamed and targeted
    evict_answer: Answer | None  # ``POST /admin/residency/evict`` while the stream ran
    copy: (
        dict[str, Any] | None
    )  # its GPU copy in ``GET /admin/residency`` just after; None: unlisted
    stream_status: int  # the stream's HTTP status
    stream_complete: bool  # it ended with ``[DONE]`` and no error event
    note: str  # what happened, in words


@dataclass(frozen=True)
class Observation:
    """Everything the checks judge."""

    registry: RegistryView
    fleet: dict[str, Any]  # ``GET /admin/fleet`` after the load test
    releases: Answer  # ``GET /admin/releases``
    before: Metrics  # ``/metrics`` before the load test
    after: Metrics  # ``/metrics`` after it, before the in-use probe
    residency: dict[str, Any]  # ``GET /admin/residency`` after it
    refusals: tuple[tuple[str, Answer], ...]  # operator routes asked with a tenant key or none
    load: LoadResult | None  # None when no adapter could be load-tested
    load_note: str  # why there was no load test, or how its keys were obtained
    in_use: InUseProbe | None  # None without a hot adapter


def read_registry(deployment: Deployment) -> RegistryView:
    tenants = deployment.admin_listing("/admin/tenants", _tenant_name, MAX_LISTED)
    listed = deployment.admin_listing("/admin/adapters", _adapter_ref, MAX_LISTED + 1)
    adapters = [deployment.admin_adapter(a["tenant"], a["name"]) for a in listed[:MAX_LISTED]]
    return RegistryView(tenants, adapters, len(listed) > MAX_LISTED)


def _adapter_ref(adapter: dict[str, Any]) -> str:
    return f"{adapter['tenant']}/{adapter['name']}"


def _tenant_name(tenant: dict[str, Any]) -> str:
    return str(tenant["name"])


def refusal_probes(
    deployment: Deployment, tenant: str, key: str | None
) -> tuple[tuple[str, Answer], ...]:
    """Operator-only calls made with a tenant key (and with none): each must be refused. Each
    answer comes with the credential it was asked with, ``tenant key`` or ``no key`` (the
    report said "tenant key or none" of every one, so the load and unload calls read twice)."""
    lora = {"lora_name": f"{tenant}/preflight-probe", "lora_path": "preflight-probe"}
    residency = {"model": f"{tenant}/preflight-probe@none", "tier": "L0"}
    calls = (
        ("POST", "/v1/load_lora_adapter", lora),
        ("POST", "/v1/unload_lora_adapter", lora),
        ("POST", "/admin/residency/evict", residency),
        ("POST", "/admin/residency/pin", residency),
        ("POST", "/admin/adapters", {"tenant": tenant, "name": "preflight-probe", "path": "x"}),
    )
    answers = [("tenant key", deployment.call(m, p, key, body)) for m, p, body in calls]
    answers += [("no key", deployment.call(m, p, None, body)) for m, p, body in calls[:2]]
    return tuple(answers)


def targets(
    registry: RegistryView, keys: dict[str, str], hits: dict[str, int]
) -> tuple[list[Target], list[Target], list[str]]:
    """The hot set (the operator's core adapters, else the most requested), the tail, and the
    adapters left out as retired: every revision their alias names is deprecated, so
    resolution serves none (a 404 by design). NOTE: they were load-tested and their 404s
    failed items 3 and 14, e.g. on any deployment ``loraplex qualify --url`` had run against
    (it retires its generated adapters so)."""
    every: dict[str, Target] = {}
    retired: list[str] = []
    for entry in registry.adapters:
        adapter, alias = entry["adapter"], entry["alias"]
        if adapter["tenant"] not in keys or alias is None:
            continue
        model = f"{adapter['tenant']}/{adapter['name']}"
        named = {t["revision"] for t in alias["targets"]}
        digests = {
            f"{model}@{r['revision']}": r["adapter_digest"]
            for r in entry["revisions"]
            if r["revision"] in named and r["state"] != "deprecated"
        }
        if not digests:
            retired.append(model)
            continue
        every[model] = Target(model, keys[adapter["tenant"]], digests)
    core = [m for m in registry.core_models() if m in every]
    ranked = sorted(every, key=lambda m: (-hits.get(m, 0), m))
    hot_models = (core or ranked[: min(2, len(ranked))])[:MAX_HOT]
    tail_models = [m for m in ranked if m not in hot_models][:MAX_TAIL]
    return [every[m] for m in hot_models], [every[m] for m in tail_models], retired


def _retired_note(retired: list[str]) -> str:
    if not retired:
        return ""
    shown = ", ".join(retired[:5]) + (", ..." if len(retired) > 5 else "")
    return (
        f"; {len(retired)} adapters not load-tested, every revision their alias names "
        f"deprecated ({shown})"
    )


def hits_by_adapter(residency: dict[str, Any]) -> dict[str, int]:
    return {h["model"].partition("@")[0]: h["hits"] for h in residency.get("hot", [])}


def _gpu_copy(deployment: Deployment, ref: str) -> dict[str, Any] | None:
    entries = deployment.admin_json("/admin/residency").get("entries", [])
    return next((e for e in entries if e["model"] == ref and e["tier"] == "L0"), None)


def in_use_probe(deployment: Deployment, target: Target) -> InUseProbe:
    """Streams ``target``; once its first token arrived, asks the admin API to evict its GPU
    copy, then reads the copy's pin and reference count. Every GPU copy of the revision is
    evicted first (nothing else asks for it), so on a fleet too the only copy left is the one
    the stream holds."""
    ref = sorted(target.digests)[0]
    evict = {"model": ref, "tier": "L0"}
    deployment.admin("POST", "/admin/residency/evict", evict)
    body = {"model": ref, "prompt": PROMPT, "max_tokens": PROBE_TOKENS, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {target.key}"}
    answer: Answer | None = None
    copy: dict[str, Any] | None = None
    complete = False
    try:
        with (
            httpx.Client(base_url=deployment.url, timeout=deployment.timeout_s) as http,
            http.stream("POST", "/v1/completions", json=body, headers=headers) as stream,
        ):
            status = stream.status_code
            if status != 200:
                return InUseProbe(ref, None, None, status, False, _refusal_note(stream))
            error = None
            for line in stream.iter_lines():
                if line.startswith("data:") and answer is None:
                    answer = deployment.admin("POST", "/admin/residency/evict", evict)
                    copy = _gpu_copy(deployment, ref)
                complete = line.strip() == "data: [DONE]" or complete
                if line.startswith("data:") and '"error"' in line:
                    complete, error = False, line.removeprefix("data:").strip()
                    break
    except httpx.HTTPError as exc:
        return InUseProbe(ref, answer, copy, 0, False, f"stream failed: {exc}")
    if error is not None:
        note = f"stream ended with an error event: {_error_message(error)}"
    else:
        note = "stream ran to [DONE]" if complete else "stream ended without [DONE]"
    return InUseProbe(ref, answer, copy, status, complete, note)


def _refusal_note(stream: httpx.Response) -> str:
    """Why a stream was refused before it opened: its status, ``Retry-After`` and message (a
    429 or 503 says when to come back; "did not complete" alone hid it)."""
    stream.read()
    retry_after = stream.headers.get("retry-after")
    wait = "" if retry_after is None else f", Retry-After {retry_after} s"
    return f"stream refused: status {stream.status_code}{wait}: {_error_message(stream.text)}"


def _error_message(text: str) -> str:
    """An OpenAI-style error body's message, else the text itself (at most 200 characters)."""
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    return str(message)[:200]


@contextmanager
def load_keys(
    deployment: Deployment, owners: list[str], tenant_key: str | None
) -> Iterator[tuple[dict[str, str], str]]:
    """Tenant keys for the load test, and how they were had: throwaway keys from the admin API
    (revoked when the block ends), else ``tenant_key`` alone (its tenant's adapters only)."""
    stack = ExitStack()
    try:
        keys = stack.enter_context(deployment.throwaway_keys(owners))
        note = f"throwaway keys for {len(owners)} tenants, revoked after"
    except KeyIssueError as exc:
        if tenant_key is None:
            raise
        tenant = deployment.tenant_of(tenant_key)
        keys = {} if tenant is None else {tenant: tenant_key}
        note = f"--tenant-key of {tenant}, its adapters only ({exc})"
    with stack:
        yield keys, note


def observe(
    deployment: Deployment, load: LoadConfig, tenant_key: str | None, settle_s: float = 1.0
) -> Observation:
    registry = read_registry(deployment)
    releases = deployment.admin("GET", "/admin/releases")
    residency = deployment.admin_json("/admin/residency")
    owners = sorted({a["adapter"]["tenant"] for a in registry.adapters})
    probe_tenant = owners[0] if owners else "preflight"
    with load_keys(deployment, owners, tenant_key) as (keys, key_note):
        refusal_key = tenant_key or keys.get(probe_tenant)
        refusals = refusal_probes(deployment, probe_tenant, refusal_key)
        before = deployment.metrics()
        hot, tail, retired = targets(registry, keys, hits_by_adapter(residency))
        note = key_note + _retired_note(retired)
        result = run_load(deployment, hot, tail, load) if hot else None
        time.sleep(settle_s)  # NOTE: a fleet's replicas report their counters periodically
        # NOTE: read before the in-use probe, which evicts its adapter's GPU copies on purpose:
        # read after it, those evictions were reported as the load test's (item 3)
        after = deployment.metrics()
        # NOTE: a tail adapter: the hot ones may be pinned, and a pinned copy is kept anyway
        probe = in_use_probe(deployment, (tail or hot)[0]) if hot else None
    # NOTE: after the load, so its routing decisions are counted in it (read before, a fresh
    # fleet showed "decisions": {} although the load test had just routed 136 requests)
    fleet = deployment.admin_json("/admin/fleet")
    if not hot:
        note = "no adapter with an alias to load-test"
    return Observation(
        registry=registry, fleet=fleet, releases=releases, before=before,
        after=after, residency=deployment.admin_json("/admin/residency"),
        refusals=refusals, load=result, load_note=note, in_use=probe,
    )  # fmt: skip


__all__ = ["Observation", "PreflightError", "observe"]
