"""The engine's frozen configuration, split into the scheduler's slice and the rest (torch-free)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from loraplex.devices import check_device
from loraplex.dtypes import DEFAULT_DTYPE, check_dtype
from loraplex.engine.mode_policy import MERGE_STEP_BUDGET_S, ModeSetting, check_merge_step_budget

# The matmul the base model's linears and head run (``model.layers``, whose
# ``LINEAR_KERNELS`` is this tuple): "blas" (``F.linear``), "onednn" (oneDNN on the dense
# weight), "packed" (oneDNN on a packed second copy of every weight: faster, the weights' bytes
# again), "auto" ("packed" for float32 on a CPU where torch has it, else "blas").
BASE_LINEAR_KERNELS = ("auto", "blas", "onednn", "packed")

_AT_LEAST_ONE = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "max_queue_len",
    "lease_lookahead",
)


def check_finite(settings: object, key: Callable[[str], str] = str) -> None:
    """ValueError naming the first float field of the dataclass ``settings`` (by ``key`` of its
    name: its config key) that is NaN or +/-inf: every range check of ours is a comparison,
    which NaN passes as a negation (``not x >= 0``) fails to see, and inf as "no limit" is no
    documented meaning of any setting (a TOML ``inf`` or a flag's ``inf`` parse as floats)."""
    for item in fields(settings):  # type: ignore[arg-type]
        value = getattr(settings, item.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key(item.name)} {value} is invalid; expected a finite number")


def check_base_linear_kernel(kernel: str, dtype: str, device: str) -> None:
    """ValueError naming ``base_linear_kernel`` when ``kernel`` is no ``BASE_LINEAR_KERNELS``
    entry or cannot run with ``dtype`` on ``device`` (oneDNN's kernels run on a CPU only; packed
    copies are made for float32 only). Whether this torch has oneDNN is checked where the model
    is built (``model.layers.resolve_linear_kernel``)."""
    if kernel not in BASE_LINEAR_KERNELS:
        raise ValueError(
            f"base_linear_kernel {kernel!r} is invalid; expected one of "
            f"{', '.join(BASE_LINEAR_KERNELS)}"
        )
    if kernel in ("onednn", "packed") and device != "cpu":
        raise ValueError(
            f"base_linear_kernel {kernel!r} is invalid on device {device!r}; expected auto or "
            "blas (oneDNN's kernels run on a CPU only)"
        )
    if kernel == "packed" and dtype != "float32":
        raise ValueError(
            f"base_linear_kernel 'packed' is invalid with dtype {dtype!r}; expected auto, blas "
            "or onednn (packed copies are made for float32 weights only)"
        )


@dataclass(frozen=True)
class SchedulerConfig:
    """Budgets and policies the scheduler plans each step within."""

    max_num_seqs: int = 32  # sequences running (holding KV blocks) at once
    max_num_batched_tokens: int = 512  # tokens in one forward (decodes + prefill chunks)
    max_model_len: int = 512  # prompt + output tokens of one sequence at most
    default_deadline_s: float = 30.0  # queue residence before QueueTimeoutError (a default)
    max_queue_len: int = 1024  # queued requests (all tenants) before QueueFullError
    lease_lookahead: int = 16  # distinct adapters queued requests (fair order) may hold/await
    prefetch_lookahead: int = 32  # further queued requests whose adapters are prefetched to L1
    # Seconds after which a request refused for a full queue, or timed out in it, may find
    # room; queue errors carry it (the HTTP layer turns it into Retry-After).
    retry_hint_s: float = 1.0
    # Sequences kept free for a higher priority class while one is active: a lower-class tenant
    # runs (and leases adapters for) at most max_num_seqs - the higher classes' running - this
    # many, so a batch tenant's backlog never leaves an arriving higher-class request without a
    # seat. 0: work-conserving admission (weights then only order it); None: a quarter of
    # max_num_seqs.
    class_reserve_seqs: int | None = None
    # Per-step work share (``sched.step_share``): while two or more tenants have work in a
    # step, the busiest (per unit of weight) decodes only as many of its sequences as keep its
    # work within this many times the next busiest tenant's (at least one; the rest keep their
    # seats and run in the next steps). 0: off, every running sequence decodes every step.
    step_work_ratio: float = 1.0
    # Paused requests (their consumers stopped reading) keep their KV blocks, so that a resume
    # recomputes nothing, while the blocks all of them keep stay within this fraction of the
    # cache (``sched.kept_kv``); freed first whenever other work needs blocks. 0: a pause
    # frees its blocks, recomputed on resume.
    max_paused_kv_fraction: float = 0.25

    def __post_init__(self) -> None:
        check_finite(self)
        for name in _AT_LEAST_ONE:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.class_reserve_seqs is not None and not (
            0 <= self.class_reserve_seqs < self.max_num_seqs
        ):
            raise ValueError(
                f"class_reserve_seqs {self.class_reserve_seqs} is invalid; expected 0 <= it < "
                f"max_num_seqs {self.max_num_seqs}"
            )
        if self.prefetch_lookahead < 0:
            raise ValueError(
                f"prefetch_lookahead {self.prefetch_lookahead} is invalid; expected >= 0"
            )
        if not self.default_deadline_s > 0:
            raise ValueError(
                f"default_deadline_s {self.default_deadline_s} is invalid; expected > 0"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens {self.max_num_batched_tokens} is invalid; expected >= "
                f"max_num_seqs {self.max_num_seqs} (every running sequence decodes each step)"
            )
        if not self.step_work_ratio >= 0:
            raise ValueError(f"step_work_ratio {self.step_work_ratio} is invalid; expected >= 0")
        if self.retry_hint_s < 0:
            raise ValueError(f"retry_hint_s {self.retry_hint_s} is invalid; expected >= 0")
        if not 0 <= self.max_paused_kv_fraction <= 1:
            raise ValueError(
                f"max_paused_kv_fraction {self.max_paused_kv_fraction} is invalid; expected 0 to 1"
            )

    @property
    def reserve_seqs(self) -> int:
        """``class_reserve_seqs`` resolved (its default: a quarter of max_num_seqs)."""
        if self.class_reserve_seqs is None:
            return self.max_num_seqs // 4
        return self.class_reserve_seqs


@dataclass(frozen=True)
class EngineConfig:
    """One engine: its scheduler, its paged KV cache and where the model runs."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # the step planner
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 1024  # KV blocks (the KV memory budget)
    dtype: str = DEFAULT_DTYPE  # model/KV dtype name (loraplex.dtypes)
    device: str = "cpu"  # torch device string
    idle_wait_s: float = 0.05  # how long the loop sleeps when nothing can run (woken early)
    # unmerged | merged:<tenant/name@revision> | auto (engine.mode_policy; docs/modes.md)
    mode: str = "unmerged"
    # the most merge staging one step boundary runs (engine.mode_policy.ModePolicyConfig)
    merge_step_budget_s: float = MERGE_STEP_BUDGET_S
    # the base linears' kernel (BASE_LINEAR_KERNELS; "packed" holds a second copy of them)
    base_linear_kernel: str = "auto"

    def __post_init__(self) -> None:
        check_finite(self)
        for name in ("block_size", "num_kv_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        check_dtype(self.dtype)
        check_device(self.device)
        check_base_linear_kernel(self.base_linear_kernel, self.dtype, self.device)
        ModeSetting.parse(self.mode)  # raises ValueError naming the mode
        check_merge_step_budget(self.merge_step_budget_s, self.mode)
        if not self.idle_wait_s > 0:
            raise ValueError(f"idle_wait_s {self.idle_wait_s} is invalid; expected > 0")
        if self.num_kv_blocks * self.block_size < self.scheduler.max_model_len:
            raise ValueError(
                f"num_kv_blocks {self.num_kv_blocks} x block_size {self.block_size} is invalid; "
                f"expected room for one max_model_len {self.scheduler.max_model_len} sequence"
            )
