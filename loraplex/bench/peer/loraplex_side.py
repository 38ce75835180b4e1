"""The loraplex side of ``loraplex bench peer``: the peer adapters registered once (same files
as the vLLM side reads), and a real ``loraplex serve`` subprocess per run, started by the same
machinery as ``bench serve`` (``serve_fleet.serving``) with the comparison's settings.

loraplex names an adapter by the owning tenant's API key plus ``name@revision``; the base model
by its directory name, which the vLLM side serves under too (``--served-model-name``).
"""

from __future__ import annotations

import secrets
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from loraplex.bench.peer.assets import PeerAssets
from loraplex.bench.peer.client import Route
from loraplex.bench.peer.vllm import PeerSettings
from loraplex.bench.serve.fleet import Fleet, Served, ServerOptions, serving, serving_process
from loraplex.registry import Registry
from loraplex.residency.policy import DEFAULT_POLICY

ACTOR = "bench-peer"
# L1 budget: far above the 16 adapters' bytes (the large preset's r16 ones: 8 MiB each), so
# every adapter stays in CPU memory, as on the vLLM side (--max-cpu-loras = all of them).
CPU_ADAPTER_BYTES = 1 << 30
REQUEST_LOG = "requests.jsonl"  # a run's request log, in its data directory (when asked for)
# Each tenant may fill every cached tier, GPU slots included: the comparison's max_loras is how
# many adapters stay in slots, as vLLM's --max-loras is. At loraplex's default share (0.5) the
# r16 mix's one tenant held 8 of 16 slots, and a third of the large preset's trace requests
# waited for a copy into a slot (docs/benchmarks/peer.md, "Large-preset trace tail").
TENANT_TIER_SHARE = 1.0


def _register(registry: Registry, assets: PeerAssets) -> tuple[str, ...]:
    """Registers the adapters; the tenants that own them. The s2 mix registers the demo set
    as ``loraplex serve --demo`` does (probes, the core adapters warm): what a user gets."""
    from loraplex.registry import RegistrationRequest
    from loraplex.serve.bootstrap import register_demo

    if assets.mix == "s2":
        return register_demo(registry, assets.demo).tenants
    tenants = tuple(dict.fromkeys(a.tenant for a in assets.adapters))
    for tenant in tenants:
        registry.create_tenant(tenant, ACTOR)
    for a in assets.adapters:
        expected = a.expected_continuation
        request = RegistrationRequest(
            adapter_dir=a.path,
            tenant=a.tenant,
            name=a.name,
            revision=a.revision,
            probe_prompt=None if expected is None else a.probe_prompt,
            expected_continuation=expected,
        )
        registry.register(request, ACTOR)
    return tenants


def prepare_fleet(root: Path, assets: PeerAssets, max_lora_rank: int) -> Fleet:
    """A registry holding every peer adapter and one API key per tenant."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.registry import RegistryConfig, open_registry

    base = BaseModelSpec.from_dir(assets.base_model_dir)
    admin = "lpxadmin_" + secrets.token_urlsafe(24)
    fleet = Fleet(root, assets.base_model_dir, {}, admin, max_lora_rank)
    config = RegistryConfig(root, fleet.database_url, str(fleet.store), None, max_lora_rank)
    registry = open_registry(config, base=base)
    try:
        for tenant in _register(registry, assets):
            fleet.keys[tenant] = registry.create_key(tenant, ACTOR).token
    finally:
        registry.close()
    return fleet


class LoraplexServer:
    """``loraplex serve`` on a prepared fleet, with one comparison's settings."""

    label = "loraplex"
    serves_adapters = True

    def __init__(
        self,
        fleet: Fleet,
        assets: PeerAssets,
        settings: PeerSettings,
        *,
        queue_deadline_s: float,
        start_timeout_s: float,
        request_log: bool = False,
    ) -> None:
        self._fleet = fleet
        self._assets = assets
        self._options = ServerOptions(
            policy=DEFAULT_POLICY,  # what a user gets
            max_loras=settings.max_loras,
            cpu_adapter_bytes=CPU_ADAPTER_BYTES,
            max_num_seqs=settings.max_num_seqs,
            # shed only when the client would give up too: a shed request counts as a failure
            queue_deadline_s=queue_deadline_s,
            torch_threads=settings.threads,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            default_tenant_tier_share=TENANT_TIER_SHARE,
        )
        self._start_timeout_s = start_timeout_s
        self._request_log = request_log  # True: each run writes REQUEST_LOG in its data dir

    def _run_options(self, data_dir: Path) -> ServerOptions:
        if not self._request_log:
            return self._options
        return replace(self._options, request_log_path=data_dir / REQUEST_LOG)

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        options = self._run_options(data_dir)
        return serving(self._fleet, data_dir, options, self._start_timeout_s)

    def serving_process(self, data_dir: Path) -> AbstractContextManager[Served]:
        """``serving``, yielding the server's process id too (its engine is a child of it)."""
        options = self._run_options(data_dir)
        return serving_process(self._fleet, data_dir, options, self._start_timeout_s)

    def routes(self) -> tuple[Route, ...]:
        """One route per adapter, in route order."""
        keys = self._fleet.keys
        return tuple(Route(f"{a.name}@{a.revision}", keys[a.tenant]) for a in self._assets.adapters)

    def base_route(self) -> Route:
        tenant = self._assets.adapters[0].tenant  # any tenant may call the base model
        return Route(self._assets.base_model_name, self._fleet.keys[tenant])


def kv_cache_bytes(assets: PeerAssets, num_blocks: int, block_size: int) -> int:
    """loraplex's KV-cache bytes: layers x (K and V) x kv_heads x head_dim x 4 (float32) bytes
    per token, ``num_blocks`` x ``block_size`` tokens."""
    from loraplex.artifacts.base_model import BaseModelSpec

    base = BaseModelSpec.from_dir(assets.base_model_dir)
    per_token = base.num_layers * 2 * base.num_kv_heads * base.head_dim * 4
    return per_token * num_blocks * block_size


def matched_settings(
    assets: PeerAssets, max_loras: int, *, threads: int, vllm_cpu_bind: str
) -> PeerSettings:
    """The settings both servers run: loraplex's defaults for context length, step token
    budget and KV-cache size, which vLLM is given; the smallest max LoRA rank vLLM accepts
    that fits the adapters, given to both."""
    from loraplex.serve.config import ServeConfig

    defaults = ServeConfig(data_dir=Path("unused"))
    return PeerSettings(
        max_loras=max_loras,
        max_lora_rank=assets.max_lora_rank,
        max_num_seqs=defaults.max_num_seqs,
        max_model_len=defaults.max_model_len,
        max_num_batched_tokens=defaults.batched_tokens(),
        kv_cache_bytes=kv_cache_bytes(assets, defaults.num_kv_blocks, defaults.block_size),
        threads=threads,
        vllm_cpu_bind=vllm_cpu_bind,
    )
