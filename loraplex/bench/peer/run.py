"""The whole ``loraplex bench peer`` against a real vLLM: the preset's assets, the three kinds
of server per setting, and the JSON line with what was matched and how."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loraplex.bench.harness.process import fresh_run_dir
from loraplex.bench.peer.assets import PeerAssets, load_preset, peer_assets
from loraplex.bench.peer.bench import PeerServer, run_peer_bench
from loraplex.bench.peer.model import PeerBenchConfig, SettingRuns
from loraplex.bench.peer.report import peer_result
from loraplex.bench.peer.vllm import PeerSettings, bound_cores
from loraplex.bench.peer.vllm_install import VllmInstall

# How the compile caches are handled, for the JSON line (see vllm.vllm_env).
COMPILE_CACHE = (
    "fresh per server run: vLLM's VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR in the run's "
    "directory; one equal unmeasured warm-up batch per run on every kind"
)


def matched_record(runs: Sequence[SettingRuns]) -> list[dict[str, Any]]:
    """Each setting's matched server settings, the KV bytes also in GiB (what
    VLLM_CPU_KVCACHE_SPACE, whole GiB only, cannot express: the bytes go to
    --kv-cache-memory-bytes and VLLM_CPU_KVCACHE_SPACE is left unset)."""
    out = []
    for run in runs:
        record = asdict(run.settings)
        record["kv_cache_gib"] = round(run.settings.kv_cache_gib(), 6)
        record["vllm_cpu_kvcache_space"] = None  # unset: see above
        out.append(record)
    return out


def vllm_bindings(root: Path) -> dict[str, list[int] | None]:
    """Per vLLM server run (its directory under ``root``), the cores vLLM bound its worker's
    OpenMP threads to, as its log says (None: it did not bind, e.g. ``nobind``)."""
    found = {}
    for log in sorted(root.rglob("vllm.log")):
        text = log.read_text(encoding="utf-8", errors="replace")
        found[log.parent.relative_to(root).as_posix()] = bound_cores(text)
    return found


def run_against_vllm(config: PeerBenchConfig, install: VllmInstall) -> dict[str, Any]:
    """The whole benchmark: loraplex against the vLLM ``install``."""
    from loraplex.bench.peer.loraplex_side import LoraplexServer, prepare_fleet
    from loraplex.bench.peer.vllm import VllmServer

    root = fresh_run_dir(config.logs_dir, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    demo = load_preset(config.asset_dir, config.preset, config.mix)
    assets = peer_assets(demo, config.mix, root / "adapters-r16", config.seed)

    def make_servers(settings: PeerSettings, root: Path) -> Sequence[PeerServer]:
        fleet = prepare_fleet(root / f"fleet-{settings.max_loras}", assets, settings.max_lora_rank)
        ours = LoraplexServer(
            fleet,
            assets,
            settings,
            queue_deadline_s=config.request_timeout_s,
            start_timeout_s=config.start_timeout_s,
        )
        timeout = config.start_timeout_s
        lora = VllmServer(install.python, assets, settings, start_timeout_s=timeout)
        base = VllmServer(install.python, assets, settings, start_timeout_s=timeout, lora=False)
        return ours, lora, base

    runs = run_peer_bench(config, assets, make_servers, root)
    result = peer_result(config, runs, f"vllm {install.version} ({install.python})")
    result["config"].update(run_record(assets, install, runs, root))
    result["logs_dir"] = str(root)
    return result


def run_record(
    assets: PeerAssets, install: VllmInstall, runs: Sequence[SettingRuns], root: Path
) -> dict[str, Any]:
    """What the JSON config adds for a real run: the adapters, vLLM's build, the matched
    settings, the compile-cache rule, loraplex's tenant tier share and vLLM's thread binding."""
    from loraplex.bench.peer.loraplex_side import TENANT_TIER_SHARE

    return {
        "adapters": [f"{a.tenant}/{a.name}@{a.revision} r{a.rank}" for a in assets.adapters],
        "vllm": install.record(),
        "matched": matched_record(runs),
        "compile_cache": COMPILE_CACHE,
        "loraplex_tenant_tier_share": TENANT_TIER_SHARE,
        "vllm_bound_cores": vllm_bindings(root),
    }
