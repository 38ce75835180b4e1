"""The tier side of a calibration, through a server's admin API: put adapters where a
measurement needs them (``prefetch``, ``into_slots``, ``evict_everywhere``), read the copies'
bytes and the loader's stage counters, and time cold loads tier by tier (``load_samples``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import httpx

from loraplex.bench.sim.calibrate_target import ServedAdapter, Target
from loraplex.sim.calibrate import LoadSample

L3_STAGES = ("resolve", "fetch", "verify", "commit")
LINK_STAGES = {"L3_to_L2": L3_STAGES, "L2_to_L1": ("read",), "L1_to_L0": ("copy",)}
LINK_TIERS = {"L3_to_L2": "L2", "L2_to_L1": "L1", "L1_to_L0": "L0"}
LINK_SIZE_TIER = {"L3_to_L2": "L2", "L2_to_L1": "L1", "L1_to_L0": "L1"}


def prefetch(client: httpx.Client, adapter: ServedAdapter, tier: str) -> None:
    """Loads ``adapter`` into ``tier`` and waits for it."""
    body = {"model": adapter.ref, "tier": tier, "wait": True}
    reply = client.post("/admin/residency/prefetch", json=body)
    reply.raise_for_status()


def stage_totals(client: httpx.Client) -> dict[str, float]:
    reply = client.get("/admin/residency", params={"top": 0})
    reply.raise_for_status()
    stages = reply.json()["stats"]["stages"]
    return {str(k): float(v["total_s"]) for k, v in stages.items()}


def copy_sizes(client: httpx.Client, adapter: ServedAdapter) -> dict[str, int]:
    """tier -> size_bytes of ``adapter``'s copies."""
    reply = client.get("/admin/residency")
    reply.raise_for_status()
    return {
        str(e["tier"]): int(e["size_bytes"])
        for e in reply.json()["entries"]
        if e["model"] == adapter.ref
    }


def evict_everywhere(client: httpx.Client, adapter: ServedAdapter) -> None:
    """Drops the adapter's copies (L0, then L1, then L2); a copy that is absent, pinned or in
    use stays (the load that follows then measures less, which the fit's residuals show)."""
    for tier in ("L0", "L1", "L2"):
        client.post("/admin/residency/evict", json={"model": adapter.ref, "tier": tier})


def into_slots(
    client: httpx.Client, adapters: Sequence[ServedAdapter], wanted: Sequence[ServedAdapter]
) -> None:
    """Prefetches ``wanted`` into L0 after dropping every other adapter's L0 copy.
    NOTE: a server refuses a prefetch its eviction policy finds not worth its victims (503),
    and a tenant past its ``default_tenant_tier_share`` evicts only its own copies, so the
    calibration frees the slots itself rather than asking the policy to evict: the one tenant
    then borrows the free slots (the share is work-conserving). Pinned copies (the server's
    automatic GPU pins) stay: ``calibrate_run.slots_for_mixes`` leaves room for them."""
    for adapter in adapters:
        if adapter not in wanted:
            client.post("/admin/residency/evict", json={"model": adapter.ref, "tier": "L0"})
    for adapter in wanted:
        prefetch(client, adapter, "L0")


def with_sizes(client: httpx.Client, target: Target) -> Target:
    """``target`` with every adapter's ``size_bytes`` known: a remote server's are read from
    its L1 copy (loaded for the purpose), the bytes a trace's ``size_bytes`` carries."""
    adapters = []
    for adapter in target.adapters:
        sized = adapter
        if adapter.size_bytes <= 0:
            prefetch(client, adapter, "L1")
            sized = replace(adapter, size_bytes=copy_sizes(client, adapter).get("L1", 0))
        adapters.append(sized)
    return replace(target, adapters=tuple(adapters))


def load_samples(
    client: httpx.Client, adapters: Sequence[ServedAdapter], store: Path | None = None
) -> list[LoadSample]:
    """One cold load per adapter, tier by tier, timed by the server's stage counters; each
    adapter is dropped again after its loads, so every load lands in free space (no eviction
    in the figure, no tier share in the way). With ``store`` (the server's artifact store on
    this machine) its cached pages are dropped first, so L3 reads come from disk."""
    from loraplex.bench.serve.fleet import drop_page_cache

    samples: list[LoadSample] = []
    for adapter in adapters:
        evict_everywhere(client, adapter)
        if store is not None:
            drop_page_cache(store)
        for link, tier in LINK_TIERS.items():
            before = stage_totals(client)
            prefetch(client, adapter, tier)
            after = stage_totals(client)
            seconds = sum(after.get(s, 0.0) - before.get(s, 0.0) for s in LINK_STAGES[link])
            nbytes = copy_sizes(client, adapter).get(LINK_SIZE_TIER[link], 0)
            if nbytes > 0 and seconds > 0:
                samples.append(LoadSample(link, nbytes, seconds))
        evict_everywhere(client, adapter)
    return samples
