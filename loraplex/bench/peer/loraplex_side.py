"""The loraplex side of ``loraplex bench peer``: the demo adapters registered once (same files
as the vLLM side reads), and a real ``loraplex serve`` subprocess per run, started by the same
machinery as ``bench serve`` (``serve_fleet.serving``) with the comparison's settings.

loraplex names an adapter by the owning tenant's API key plus ``name@revision``; the base model
by its directory name, which the vLLM side serves under too (``--served-model-name``).
"""

from __future__ import annotations

import secrets
from contextlib import AbstractContextManager
from pathlib import Path

from loraplex.bench.peer.client import Route
from loraplex.bench.peer.vllm import PeerSettings
from loraplex.bench.serve.fleet import Fleet, ServerOptions, serving
from loraplex.demo.manifest import DemoAssets
from loraplex.residency.policy import DEFAULT_POLICY

ACTOR = "bench-peer"
# L1 budget: far above the 16 demo adapters' bytes, so every adapter stays in CPU memory, as
# on the vLLM side (--max-cpu-loras = all of them).
CPU_ADAPTER_BYTES = 256 << 20


def prepare_demo_fleet(root: Path, assets: DemoAssets, max_lora_rank: int) -> Fleet:
    """A registry holding every demo revision (with its probe) and one API key per tenant."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.registry import RegistryConfig, open_registry
    from loraplex.serve.bootstrap import register_demo

    base = BaseModelSpec.from_dir(assets.base_model_dir)
    admin = "lpxadmin_" + secrets.token_urlsafe(24)
    fleet = Fleet(root, assets.base_model_dir, {}, admin, max_lora_rank)
    config = RegistryConfig(root, fleet.database_url, str(fleet.store), None, max_lora_rank)
    registry = open_registry(config, base=base)
    try:
        state = register_demo(registry, assets)
        for tenant in state.tenants:
            fleet.keys[tenant] = registry.create_key(tenant, ACTOR).token
    finally:
        registry.close()
    return fleet


class LoraplexServer:
    """``loraplex serve`` on a prepared demo fleet, with one comparison's settings."""

    label = "loraplex"

    def __init__(
        self,
        fleet: Fleet,
        assets: DemoAssets,
        settings: PeerSettings,
        *,
        queue_deadline_s: float,
        start_timeout_s: float,
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
        )
        self._start_timeout_s = start_timeout_s

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        return serving(self._fleet, data_dir, self._options, self._start_timeout_s)

    def routes(self) -> tuple[Route, ...]:
        """One route per demo adapter, in manifest order."""
        keys = self._fleet.keys
        return tuple(Route(f"{a.name}@{a.revision}", keys[a.tenant]) for a in self._assets.adapters)

    def base_route(self) -> Route:
        tenant = self._assets.adapters[0].tenant  # any tenant may call the base model
        return Route(self._assets.base_model_name, self._fleet.keys[tenant])


def matched_settings(
    assets: DemoAssets, max_loras: int, *, threads: int, vllm_cpu_bind: str
) -> PeerSettings:
    """The settings both servers run: loraplex's defaults for context length and KV-cache size
    (``num_kv_blocks`` x ``block_size`` tokens of float32 K and V), which vLLM is given."""
    from loraplex.artifacts.base_model import BaseModelSpec
    from loraplex.serve.config import ServeConfig

    defaults = ServeConfig(data_dir=Path("unused"))
    base = BaseModelSpec.from_dir(assets.base_model_dir)
    per_token = 2 * base.num_layers * base.num_kv_heads * base.head_dim * 4  # K and V, float32
    return PeerSettings(
        max_loras=max_loras,
        max_lora_rank=defaults.max_lora_rank,
        max_num_seqs=defaults.max_num_seqs,
        max_model_len=defaults.max_model_len,
        kv_cache_bytes=defaults.num_kv_blocks * defaults.block_size * per_token,
        threads=threads,
        vllm_cpu_bind=vllm_cpu_bind,
    )
