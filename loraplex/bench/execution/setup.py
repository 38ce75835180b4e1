"""``loraplex bench execution``: mixed-adapter execution speed next to base, single and PEFT.

Headline (batch 16, 16 distinct adapters, S2 ranks on q/k/v/o, decode): tokens/s of base-only,
one adapter, the mixed batch (loraplex's auto backend and each variant forced), the mixed batch
of 16 distinct rank-16 adapters (``mixed_r16``), and PEFT's mixed batch on the S2 weights, all
interleaved in one run, for float32 and bfloat16. Then the
qualification matrix of WORKLOADS.md (float32, one axis varied at a time around the defaults).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from loraplex.bench.adapters import S2_RANKS, write_random_adapter, write_random_base
from loraplex.bench.execution.runners import StepShape
from loraplex.dtypes import torch_dtype
from loraplex.model.adapter_weights import AdapterWeights

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
RANK_MIXES = {"all-8": (8,), "all-16": (16,), "S2": S2_RANKS, "all-64": (64,)}
# The headline's second mix: one rank on q/k/v/o, as many real deployments serve (issue 16).
UNIFORM_MIX = "all-16"
POPULARITY = ("identical", "distinct", "uniform", "zipf", "geometric")
TOKENS = {"decode": 1, "prefill-64": 64, "prefill-512": 512}
DTYPES = {name: torch_dtype(name) for name in ("float32", "bfloat16")}  # the CPU-runnable ones
MAX_RANK = 64
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Case:
    """One point of the qualification matrix."""

    active: int = 16  # adapters the batch draws from (at most batch_size are distinct)
    mix: str = "S2"  # rank mix, a RANK_MIXES key
    popularity: str = "distinct"  # how sequences pick adapters, a POPULARITY entry
    tokens: str = "decode"  # step kind, a TOKENS key
    batch_size: int = 16  # sequences per step

    def shape(self, context_tokens: int) -> StepShape:
        return StepShape(self.batch_size, TOKENS[self.tokens], context_tokens)


@dataclass(frozen=True)
class ExecutionBenchConfig:
    """What ``loraplex bench execution`` runs."""

    preset: str = "small"  # demo preset whose shapes the base model has
    dtypes: tuple[str, ...] = ("float32", "bfloat16")  # headline dtypes
    context_tokens: int = 64  # KV positions each decode token attends to
    rounds: int = 12  # interleaved timing rounds (medians)
    calls_per_round: int = 4  # timed forwards per variant per round
    matrix: bool = True  # run the qualification matrix after the headline
    matrix_axes: dict[str, tuple[object, ...]] = field(
        default_factory=lambda: {
            "active": (1, 4, 16, 32),
            "mix": tuple(RANK_MIXES),
            "popularity": POPULARITY,
            "tokens": tuple(TOKENS),
            "batch_size": (1, 8, 16, 32),
        }
    )  # axis -> values, varied one at a time around Case()
    peft: bool = True  # include PEFT's mixed batch in the headline
    seed: int = 0  # adapter weights and popularity draws
    device: str = "cpu"  # where the model, KV cache and slot pools live (a DEVICES entry)
    backend: str = "auto"  # LoRA op backend of the headline's "mixed" and "mixed_r16" pools
    batch_size: int = 16  # headline sequences per step, round-robin over its 16 adapters

    def __post_init__(self) -> None:
        from loraplex.ops import backend_names

        unknown = [d for d in self.dtypes if d not in DTYPES]
        if unknown or not self.dtypes:
            raise ValueError(f"dtypes {self.dtypes} is invalid; expected some of {list(DTYPES)}")
        for name in ("context_tokens", "rounds", "calls_per_round", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is invalid; expected one of {DEVICES}")
        if self.backend not in backend_names():
            raise ValueError(
                f"backend {self.backend!r} is invalid; expected one of {backend_names()}"
            )


def seq_slots(case: Case, batch_size: int, rng: random.Random) -> list[int]:
    """Adapter slot of each sequence under the case's popularity over ``case.active`` slots."""
    n = case.active
    if case.popularity == "identical":
        return [0] * batch_size
    if case.popularity == "distinct":
        return [i % n for i in range(batch_size)]
    if case.popularity == "uniform":
        return [rng.randrange(n) for _ in range(batch_size)]
    if case.popularity == "zipf":
        weights = [1.0 / (i + 1) for i in range(n)]
    else:
        weights = [1.5**-i for i in range(n)]
    return rng.choices(range(n), weights=weights, k=batch_size)


def adapter_bytes(weights: list[AdapterWeights], slots: list[int]) -> int:
    """Bytes of the distinct adapters a step uses (each is read once per step at best)."""
    return sum(weights[slot].num_bytes for slot in set(slots))


@dataclass
class Workspace:
    """Generated base model and adapters (per rank mix) in a temporary directory."""

    root: Path  # temporary directory
    model_dir: Path  # random base checkpoint of the preset's shapes
    adapters: dict[str, list[Path]]  # rank mix -> adapter dirs (ranks round-robin)

    @classmethod
    def create(
        cls,
        root: Path,
        preset: str,
        num_adapters: int,
        seed: int,
        mixes: tuple[str, ...] | None = None,
    ) -> Workspace:
        """Generate the base and ``num_adapters`` adapters of each rank mix (``mixes``, default
        every RANK_MIXES key)."""
        from loraplex.artifacts.base_model import BaseModelSpec

        model_dir = write_random_base(root / "models" / f"bench-{preset}", preset, seed)
        spec = BaseModelSpec.from_dir(model_dir)
        adapters: dict[str, list[Path]] = {}
        for mix, ranks in RANK_MIXES.items():
            if mixes is not None and mix not in mixes:
                continue
            adapters[mix] = [
                write_random_adapter(
                    spec,
                    model_dir,
                    root / "adapters" / mix / f"a{i}",
                    rank=ranks[i % len(ranks)],
                    target_modules=ATTENTION,
                    seed=seed * 1000 + i,
                )
                for i in range(num_adapters)
            ]
        return cls(root, model_dir, adapters)
