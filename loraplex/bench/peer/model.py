"""What one ``loraplex bench peer`` comparison is and what it measured: the invocation's
settings, the requests every server run sends, one run's figures and a setting's runs. Both the
driver (``peer``) and the report (``peer_report``) read these; neither imports the other's
module for them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loraplex.bench.peer.assets import check_mix
from loraplex.bench.peer.client import BatchResult, Shot
from loraplex.bench.peer.vllm import PeerSettings, check_cpu_bind


@dataclass(frozen=True)
class PeerBenchConfig:
    """What one invocation measures."""

    max_loras: tuple[int, ...] = (8, 16)  # GPU-slot settings compared, one after the other
    requests: int = 64  # requests of the adapter batch (and of the base batch)
    prompt_tokens: int = 64  # prompt length of the batches and the trace
    output_tokens: int = 32  # tokens generated per batch or trace request (ignore_eos)
    trace_requests: int = 128  # mean requests of the zipf trace
    load: float = 0.5  # trace rate as a fraction of the slower side's capacity
    greedy_prompts: int = 16  # random prompts whose greedy continuations are compared
    greedy_tokens: int = 16  # max_tokens of each greedy continuation
    rounds: int = 5  # lifetimes per server kind and setting (ABBA order over the kinds)
    request_timeout_s: float = 120.0  # bound on every request; failures count at it
    start_timeout_s: float = 600.0  # bound on start to first answer; a failure counts at it
    threads: int = 1  # compute threads of each server
    vllm_cpu_bind: str = "auto"  # VLLM_CPU_OMP_THREADS_BIND of the vLLM side
    seed: int = 0  # prompts, trace and the r16 adapters' weights
    asset_dir: Path = Path(".loraplex-assets")  # demo assets cache (<dir>/test-<preset>)
    preset: str = "small"  # demo preset of the base model: small or large
    adapter_mix: str | None = None  # s2 or r16 (assets.MIXES); None: the preset's default
    logs_dir: Path = Path(".loraplex-bench/peer")  # each invocation's server logs, kept

    def __post_init__(self) -> None:
        if not self.max_loras or min(self.max_loras) < 1:
            raise ValueError(f"max_loras {self.max_loras} is invalid; expected counts >= 1")
        for name in (
            "requests",
            "prompt_tokens",
            "output_tokens",
            "trace_requests",
            "greedy_prompts",
            "greedy_tokens",
            "threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.rounds < 2:
            raise ValueError(
                f"rounds {self.rounds} is invalid; expected >= 2 (the trace needs both sides' "
                "capacity from a first lifetime each)"
            )
        for name in ("load", "request_timeout_s", "start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")
        check_cpu_bind(self.vllm_cpu_bind)
        check_mix(self.preset, self.adapter_mix)

    @property
    def mix(self) -> str:
        """The adapter mix that runs: ``adapter_mix``, or the preset's default."""
        return check_mix(self.preset, self.adapter_mix)


@dataclass(frozen=True)
class Workloads:
    """The requests every lifetime sends (the same for both sides)."""

    probes: tuple[tuple[int, str, int], ...]  # (adapter index, probe prompt, max_tokens)
    expected: tuple[str | None, ...]  # each probe's expected continuation; None: unchecked
    greedy: tuple[tuple[int, tuple[int, ...], int], ...]  # (route index, prompt ids, max_tokens)
    warmup: tuple[Shot, ...]  # unmeasured batch over the adapters
    adapter_batch: tuple[Shot, ...]  # measured batch over the adapters
    base_batch: tuple[Shot, ...]  # the same prompts on the base model (route index = base)


@dataclass(frozen=True)
class Lifetime:
    """What one server run measured."""

    label: str  # the server kind
    # process start to the first answer (an adapter's; the base model's for a server without
    # adapters); None: none came
    first_answer_s: float | None
    probes: tuple[str | None, ...]  # each probe's answer text (None: failed; () without LoRA)
    greedy: tuple[str | None, ...]  # each greedy prompt's continuation (() without LoRA)
    adapter: BatchResult | None  # the adapter batch; None: a server without adapters
    base: BatchResult  # the base-model batch
    trace: BatchResult | None  # the zipf trace; None before both capacities were known
    peak_rss_bytes: int | None = None  # the process tree's peak; None without /proc


@dataclass(frozen=True)
class SettingRuns:
    """Every lifetime of one max_loras setting, and the trace rate both sides ran."""

    settings: PeerSettings  # what every server ran with
    # the kinds' labels: loraplex's, the other server's, then (if run) the other server's
    # without adapters
    labels: tuple[str, ...]
    lifetimes: tuple[Lifetime, ...]  # in run order
    trace_rate: float | None  # requests/s of the common-rate trace; None: not run
    expected: tuple[str | None, ...]  # each probe's expected continuation; None: unchecked
