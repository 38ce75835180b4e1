"""WORKLOADS.md workloads as simulator trace rows (``t_s, tenant, adapter, prompt_tokens,
output_tokens, rank[, size_bytes]``): the same requests the real runs replay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loraplex.bench.workloads import Workload


def workload_rows(
    workload: Workload, max_lora_rank: int, sizes: Mapping[tuple[str, str], int] | None = None
) -> list[dict[str, Any]]:
    """One row per request; ``rank`` as served (capped at ``max_lora_rank``, as ``bench serve``
    registers it) and ``size_bytes`` from ``sizes`` ((tenant, name) -> bytes) where given."""
    ranks = {(a.tenant, a.name): min(a.rank, max_lora_rank) for a in workload.adapters}
    rows = []
    for r in workload.requests:
        row: dict[str, Any] = {
            "t_s": r.t_s,
            "tenant": r.tenant,
            "adapter": r.adapter,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "rank": ranks[(r.tenant, r.adapter)],
        }
        if sizes is not None:
            row["size_bytes"] = sizes[(r.tenant, r.adapter)]
        rows.append(row)
    return rows
