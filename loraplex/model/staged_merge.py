"""A merge built beside the live weights, a bounded piece at a time, then swapped in.

The in-place merge (``WeightMerger`` on CUDA) writes ``W += s B A`` into the live weights, so
no step may run until every module is written and (with the "packed" kernel) packed again: on
the large preset on a CPU that was a 0.25-0.45 s stall of every request in flight
(docs/modes.md, "Staged merge"). Here each module's merged weight is a NEW tensor
(``W + s B A`` in float32, stored in the model's dtype, packed when the kernel packs), built
by :meth:`MergeStaging.advance` a few modules per call within a time budget while the live
weights keep serving unmerged. The refusal check
(``MAX_DELTA_RATIO``) runs on the way: a refused module abandons the staging and nothing live
changed. Once every module is staged, :meth:`StagedWeights.swap_in` replaces the live
parameters by reference (O(modules)); the originals are kept by reference with their packed
copies, so :meth:`StagedWeights.swap_out` is the exact reverse (bit for bit, no copy, no pack).

On the CPU the merged weights are tensors on ONE mapping for the whole staging (an arena:
``buffers.arena_mapping``, mapped at the first :meth:`MergeStaging.advance`, sized for every module,
2 MiB aligned), one after another at page-aligned offsets, instead of a fresh ``weight_buffer``
each: a module's first write was the most of its time between steps, its page faults (docs/modes.md,
"Why a module costs more between steps"). NOT advised huge pages (``ARENA_HUGE_PAGES``): on the
2-core Firecracker VM this was measured on (Intel, kernel 6.18, free page reporting from 8 MiB
blocks) a fresh 2 MiB page's first write cost more than its 512 small pages'
(``scripts/stage-cost/probe.py``, large bfloat16: a module between steps 2.7-3.0 ms on 4 KiB pages
of the arena, 10.3-12.1 ms on its huge pages, 7.2-8.3 ms on buffers of their own, that mix of both;
docs/modes.md, "The staging's arena"). Once every page is written (:meth:`MergeStaging.result`) the
arena is advised huge pages, so khugepaged may collapse it later, off the step boundaries. Each
merged weight is a tensor of its own on the mapping (``buffers.arena_tensor``), not a view of one
tensor: a view shares its base's version counter, so writing the next module would make the packed
copies of those before it stale. The mapping is freed once the last merged weight is gone (an
abandon, the unmerge: the merger drops the swapped weights; :meth:`MergeStaging.result` hands
them over and keeps none), by pieces between steps through the merger's
``buffers.ArenaReleases``: freed at once, inside the unmerge's slot lock, the large preset's
arena held the steps 23-37 ms.

Memory: the staged copies are the targeted weights' bytes again (what the in-place path's host
backup held; the arena rounds each module up to 4 KiB and the whole to 2 MiB), plus their
packed copies with the "packed" kernel, from the first staged module until the unmerge (or an
abandon) drops them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from mmap import mmap

import torch
from torch import nn

from loraplex.model.adapter_weights import AdapterWeights, ModuleWeights
from loraplex.model.buffers import (
    ArenaReleases,
    advise_huge_pages,
    arena_mapping,
    arena_tensor,
    weight_buffer,
)
from loraplex.model.layers import Linear
from loraplex.model.llama import LlamaModel

Key = tuple[int, str]  # (layer, module)

# Each module's merged weight starts on a page of the arena, as a buffer of its own did
# (the same alignment for the GEMM and the cast that write it)
ARENA_ALIGN_BYTES = 4096
# Whether the arena is advised huge pages: no, their first write cost more between steps than
# small pages' where measured (the module's docstring)
ARENA_HUGE_PAGES = False


@dataclass(frozen=True)
class StagedModule:
    """One module's merged weight, built beside the live one."""

    linear: Linear  # the live layer whose weight it replaces
    original: nn.Parameter  # the live weight it was built from (kept by reference)
    merged: nn.Parameter  # ``original + s B A`` in the model's dtype (packed if the kernel packs)


class StagedWeights:
    """Every module's merged weight, ready to swap in (and back out)."""

    def __init__(self, modules: tuple[StagedModule, ...], arena: mmap | None = None) -> None:
        self.modules = modules
        # the mapping the merged weights are made on (CPU), for the merger to free by pieces
        # once they are dropped (``buffers.ArenaReleases``); None: buffers of their own
        self.arena = arena

    def swap_in(self) -> None:
        """The live layers run the merged weights (the caller holds the slot lock)."""
        for staged in self.modules:
            if staged.linear.weight is not staged.original:
                raise RuntimeError("a live weight changed while staged; expected the original")
        for staged in self.modules:
            staged.linear.weight = staged.merged

    def swap_out(self) -> None:
        """The live layers run their original weights again, the very same tensors."""
        for staged in self.modules:
            staged.linear.weight = staged.original


class MergeStaging:
    """``weights`` merged module by module beside ``model``'s live weights.

    ``check`` refuses a module (raises) before its merged weight is built; ``clock`` is the
    engine's (seconds), so a test can count the modules one :meth:`advance` stages."""

    def __init__(
        self,
        model: LlamaModel,
        weights: AdapterWeights,
        linear_of: Callable[[int, str], Linear],
        check: Callable[[ModuleWeights, torch.Tensor, torch.Tensor, torch.Tensor], None],
        clock: Callable[[], float],
        *,
        releases: ArenaReleases | None = None,
    ) -> None:
        self.model = model
        # where an abandon hands the arena (freed by pieces between steps); None: at once
        self._releases = releases
        self.weights = weights
        self.clock = clock
        self._linear_of = linear_of
        self._check = check
        self._next = 0  # index into weights.modules of the next module to stage
        self._staged: list[StagedModule] = []
        self._num_staged = 0
        # CPU: the mapping every merged weight is made on, and where module i's starts in it
        # (mapped at the first advance, dropped once the merged weights are handed over)
        self._arena: tuple[mmap, list[int]] | None = None
        # float32 room for one 16-bit module's ``W + s B A``, reused module after module: two
        # fresh float32 temporaries per module cost page faults of their own between steps
        self._scratch: torch.Tensor | None = None
        self.seconds = 0.0  # staging work so far (every advance's own time)
        self.num_calls = 0  # advances run (the step boundaries it took)

    @property
    def done(self) -> bool:
        return self._next == len(self.weights.modules)

    @property
    def num_staged(self) -> int:
        return self._num_staged

    def advance(self, budget_s: float) -> int:
        """Stage modules until the next one would likely end past ``budget_s`` from now (the
        mean module so far as its estimate); at least one, so every call makes progress.
        Returns the modules staged. Raises what ``check`` raises; the staging is then dead."""
        start = self.clock()
        count = 0
        modules = self.weights.modules
        while self._next < len(modules):
            elapsed = self.clock() - start
            if count and elapsed + elapsed / count > budget_s:
                break
            self._staged.append(self._stage(modules[self._next]))
            self._next += 1
            self._num_staged += 1
            count += 1
        self.seconds += self.clock() - start
        self.num_calls += 1
        return count

    def _scratch_like(self, weight: torch.Tensor) -> torch.Tensor:
        """A float32 view of ``weight``'s shape on the reused scratch (grown when too small)."""
        numel = weight.numel()
        if self._scratch is None or self._scratch.numel() < numel:
            self._scratch = weight_buffer((numel,), dtype=torch.float32, device=weight.device)
        return self._scratch[:numel].view(weight.shape)

    def result(self) -> StagedWeights:
        if not self.done:
            raise RuntimeError(
                f"staging has {len(self.weights.modules) - self._next} modules to go; "
                "expected every module staged"
            )
        if self._arena is not None and not ARENA_HUGE_PAGES:
            # every page written: advised huge pages only now, so khugepaged may collapse them
            # in its own thread, off the step boundaries (the base weights' huge pages gave a
            # decode step 4-5 % on the large preset: docs/benchmarks/execution.md, "The base
            # weights on huge pages"); their first write was the cost at the boundaries
            advise_huge_pages(self._arena[0])
        # handed over: the staging keeps no reference, so the arena goes with the merged
        # weights (at the unmerge, to the merger's releases), however long this object lives
        staged, self._staged = tuple(self._staged), []
        arena = None if self._arena is None else self._arena[0]
        self._scratch = self._arena = None
        return StagedWeights(staged, arena)

    def abandon(self) -> None:
        """Drop the staged weights (and, through their weak references, their packed copies);
        the arena goes to ``releases`` (freed by pieces once they are gone), else with the
        last of them."""
        self._staged.clear()
        if self._arena is not None and self._releases is not None:
            self._releases.add(self._arena[0])
        self._scratch = self._arena = None
        self._next = len(self.weights.modules)

    def _output(self, original: torch.Tensor) -> torch.Tensor:
        """Module ``self._next``'s merged weight's storage: on the CPU its place on the arena
        (mapped now if not yet, sized for every module), elsewhere a buffer of its own."""
        if original.device.type != "cpu":
            return weight_buffer(
                tuple(original.shape), dtype=original.dtype, device=original.device
            )
        if self._arena is None:
            offsets, end = [], 0
            for module in self.weights.modules:
                offsets.append(end)
                weight = self._linear_of(module.layer, module.module).weight
                end += -(-weight.nbytes // ARENA_ALIGN_BYTES) * ARENA_ALIGN_BYTES
            mapping, start = arena_mapping(end, huge_pages=ARENA_HUGE_PAGES)
            self._arena = (mapping, [start + offset for offset in offsets])
        mapping, offsets = self._arena
        return arena_tensor(mapping, offsets[self._next], tuple(original.shape), original.dtype)

    def _stage(self, module: ModuleWeights) -> StagedModule:
        linear = self._linear_of(module.layer, module.module)
        original = linear.weight
        # NOTE: never under inference mode: an inference tensor cannot be packed
        with torch.inference_mode(False), torch.no_grad():
            lora_a = module.lora_a.to(original.device, torch.float32)
            lora_b = module.lora_b.to(original.device, torch.float32)
            self._check(module, original, lora_a, lora_b)
            out = self._output(original)
            if original.dtype == torch.float32:  # ``float()`` would be the live tensor itself
                torch.addmm(original, lora_b, lora_a, alpha=module.scale, out=out)
            else:  # the in-place merge's float32 math, in the reused scratch
                scratch = self._scratch_like(original)
                scratch.copy_(original)
                scratch.addmm_(lora_b, lora_a, alpha=module.scale)
                out.copy_(scratch)
            merged = nn.Parameter(out, requires_grad=False)
        self.model.pack(merged)
        return StagedModule(linear, original, merged)
