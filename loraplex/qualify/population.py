"""The adapters qualification adds to the deployment: real PEFT files of the base model's shapes
(``bench/adapters.write_random_adapter``), registered through the public admin API under two
victim tenants and one hostile tenant, and retired at the end, even after a failure.

NOTE: the admin API has no delete; "removed" means each revision is set ``deprecated`` (no alias
resolves to it), its alias is left pointing at it, and its cached copies are evicted from every
tier. The files stay in the deployment's artifact store (docs/qualification.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.base_model import ATTENTION_MODULES, TARGET_MODULES, BaseModelSpec
from loraplex.qualify.client import Admin, QualifyError
from loraplex.registry.sql.paging import every_row

VICTIMS = ("qualify-a", "qualify-b")  # the tenants whose traffic is judged
HOSTILE = "qualify-hostile"  # the tenant that attacks them
REVISION = "q2"  # every generated adapter's revision label (q1: weaker weights, before probes
# had to tell an adapter from the base model; its files are not reused)
# B's standard deviation at rank 8; other ranks scale it by sqrt(8 / rank), so every rank moves
# the output about as far. Measured on the small demo model: 0.02 (bench/adapters' default) left
# 9 of 24 rank-8 probes answering as the base model, 0.15 none of 24 (docs/qualification.md).
PROBE_B_STD_AT_RANK_8 = 0.15
_HEAVY_TAIL = (128, 8, 8, 16, 8, 64, 8, 16, 32, 8, 8, 16)  # one 128 in 12, most at rank 8


@dataclass(frozen=True)
class GeneratedAdapter:
    """One adapter this run wrote and registered."""

    tenant: str  # owner
    name: str  # adapter name
    rank: int  # LoRA rank
    targets: tuple[str, ...]  # target modules
    path: Path  # the PEFT directory on this machine (for offline references)

    @property
    def alias(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def ref(self) -> str:
        return f"{self.tenant}/{self.name}@{REVISION}"


def rank_and_targets(distribution: str, index: int) -> tuple[int, tuple[str, ...]]:
    """The ``index``-th adapter of a rank distribution (plan.RANK_DISTRIBUTIONS)."""
    attention = tuple(ATTENTION_MODULES)
    if distribution == "all-8":
        return 8, attention
    if distribution == "mixed":  # 4 to 64, attention-only and attention+MLP alternating
        rank = (4, 8, 16, 32, 64)[index % 5]
        return rank, attention if index % 2 else tuple(TARGET_MODULES)
    rank = _HEAVY_TAIL[index % len(_HEAVY_TAIL)]
    return rank, attention if rank < 64 else tuple(TARGET_MODULES)


def plan_adapters(needed: dict[str, int], hostile: int, workdir: Path) -> list[GeneratedAdapter]:
    """Every adapter to write: ``needed[distribution]`` per rank distribution (alternating
    between the victim tenants) and ``hostile`` rank-8 ones for the hostile tenant."""
    out = []
    for distribution, count in needed.items():
        for i in range(count):
            rank, targets = rank_and_targets(distribution, i)
            name = f"{distribution}-{i:04d}"
            tenant = VICTIMS[i % len(VICTIMS)]
            out.append(
                GeneratedAdapter(tenant, name, rank, targets, workdir / REVISION / tenant / name)
            )
    for i in range(hostile):
        path = workdir / REVISION / HOSTILE / f"storm-{i:04d}"
        out.append(GeneratedAdapter(HOSTILE, f"storm-{i:04d}", 8, tuple(ATTENTION_MODULES), path))
    return out


def write_adapters(adapters: list[GeneratedAdapter], model_dir: Path, seed: int) -> None:
    """The PEFT files (random non-zero weights seeded by the plan's seed and the adapter's
    tenant and name: a rerun, whatever its plan, writes and registers the same bytes, so files
    already written are kept and registration is idempotent)."""
    from loraplex.bench.adapters import write_random_adapter  # imports torch

    base = BaseModelSpec.from_dir(model_dir)
    for adapter in adapters:
        if (adapter.path / "adapter_model.safetensors").is_file():
            continue
        own_seed = seed * 1_000_003 + zlib.crc32(adapter.ref.encode("utf-8"))
        write_random_adapter(
            base, model_dir, adapter.path, rank=adapter.rank, target_modules=adapter.targets,
            seed=own_seed, b_std=PROBE_B_STD_AT_RANK_8 * (8 / adapter.rank) ** 0.5,
        )  # fmt: skip


def ensure_tenants(admin: Admin) -> None:
    """The victim and hostile tenants (kept if they exist: the admin API deletes no tenant)."""
    existing = {
        row["name"]
        for row in every_row(
            lambda page: admin.must("GET", "/admin/tenants", params=page.params()),
            lambda row: str(row["name"]),
        )
    }
    for tenant in (*VICTIMS, HOSTILE):
        if tenant not in existing:
            admin.must("POST", "/admin/tenants", json={"name": tenant})


@contextmanager
def tenant_keys(admin: Admin, tenants: list[str]) -> Iterator[dict[str, str]]:
    """A fresh API key per tenant, revoked when the block ends (those issued before a failure
    too)."""
    keys: dict[str, str] = {}
    key_ids: list[str] = []
    try:
        for tenant in tenants:
            issued = admin.must("POST", f"/admin/tenants/{tenant}/keys")
            keys[tenant] = issued["token"]
            key_ids.append(issued["key_id"])
        yield keys
    finally:
        for key_id in key_ids:
            admin.call("DELETE", f"/admin/keys/{key_id}")


# NOTE: a deployment on serve's defaults (max_lora_rank 64) refused the default plan's first
# heavy-tail adapter and the run ended on the bare 422, with nothing saying what to change.
REFUSED_HINT = (
    "; the adapters are generated for --assets' base model at the plan's ranks (heavy-tail "
    "has rank 128): the deployment must serve that model with max_lora_rank at least the "
    "plan's largest rank (`--self` runs 128), or leave heavy-tail out of "
    "matrix.rank_distributions"
)


def register(admin: Admin, adapter: GeneratedAdapter) -> None:
    """Upload, make the revision stable (a rerun finds it deprecated) and point the alias at it."""
    fields = {"tenant": adapter.tenant, "name": adapter.name, "revision": REVISION}
    reply = admin.upload(adapter.path, fields)
    if reply.status not in (200, 201):
        raise QualifyError(
            f"registering {adapter.ref} (rank {adapter.rank}): {reply.status} "
            f"{str(reply.body)[:300]}{REFUSED_HINT if reply.status == 422 else ''}",
            reply.status,
        )
    path = f"/admin/revisions/{adapter.tenant}/{adapter.name}/{REVISION}"
    admin.must("PUT", path, json={"state": "stable"})
    alias = f"/admin/adapters/{adapter.tenant}/{adapter.name}/alias"
    admin.must("PUT", alias, json={"targets": [{"revision": REVISION}]})


def register_all(
    admin: Admin, adapters: list[GeneratedAdapter], registered: list[GeneratedAdapter]
) -> None:
    """``register`` each of ``adapters``, the largest rank first, appending each to
    ``registered`` once it is (the caller retires those). NOTE: in the plan's order a deployment
    whose ``max_lora_rank`` refuses the plan's largest rank refused it only after every smaller
    adapter was registered (32 uploads on the default plan, retired again) before the run ended
    on the refusal; now the first upload is refused and nothing else is registered."""
    for adapter in sorted(adapters, key=lambda a: -a.rank):  # stable: the plan's order within
        register(admin, adapter)
        registered.append(adapter)


def retire(admin: Admin, adapters: list[GeneratedAdapter]) -> list[str]:
    """Deprecate every registered revision and evict its copies; the refs that could not be
    retired (reported, never raised: this runs in ``finally``)."""
    failed = []
    for adapter in adapters:
        path = f"/admin/revisions/{adapter.tenant}/{adapter.name}/{REVISION}"
        try:
            reply = admin.call("PUT", path, json={"state": "deprecated"})
            for tier in ("L0", "L1", "L2"):
                body = {"model": adapter.ref, "tier": tier}
                admin.call("POST", "/admin/residency/evict", json=body)
        except QualifyError:
            failed.append(adapter.ref)
            continue
        if reply.status not in (200, 404):
            failed.append(adapter.ref)
    return failed
