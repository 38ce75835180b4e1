"""Why a staged merge's module costs more between decode steps than in a row (stagecost).

The ``bench modes`` setup (large preset), then a staged merge of the hot revision timed piece by
piece per module, the pieces as ``MergeStaging._stage`` runs them: ``factors`` (A, B to float32),
``check`` (the refusal check), ``alloc`` (the output buffer), ``build`` (the float32 math and
the write of the output: its first touch), ``pack``. Modes, each ``rounds`` times, alternating:
``row`` (every module back to back), ``between`` (``per_piece`` modules, then one real decode
step of ``batch`` sequences, as the engine interleaves them). The output buffer: a fresh
``weight_buffer`` per module (what staged_merge did before stagefault) unless the suffix says:
``_arena`` the staging's own (``MergeStaging._output``: one 2 MiB-aligned mapping for the whole
staging, ``ARENA_HUGE_PAGES``: 4 KiB pages), ``_arenahuge`` the same layout advised huge pages
(what stagefault tried first), ``_populate`` that huge-page arena with each module's pages
filled by ``MADV_POPULATE_WRITE`` before the write (timed as ``alloc``), ``_heap``
``torch.empty`` (glibc's heap, its freed memory reused), ``_prefault`` buffers written once
before the staging (outside the timing); ``_tiled`` the float32 math in row blocks,
``_serial`` on one torch thread. ``write_first`` / ``write_rest``: the write of a piece's first
module (right after the step) / of the others. ``merged*``: staged in a row, committed, then
``merged_step_ms``: the median of ``MERGED_STEPS`` decode steps on the merged weights (how fast
they read from that buffer), unmerged. An arena run also reports ``huge_share`` (the arena's
``AnonHugePages`` / ``Rss`` in ``/proc/self/smaps`` once every module is staged). Prints one
JSON line of per-module median ms per piece and mode. Run niced: ``nice -n 19 python
scripts/stage-cost/probe.py large bfloat16 3 3 [mode,mode,...]`` (default modes:
``row,between,row_arena,between_arena,between_prefault``; all: ``ALL_MODES``).
"""

from __future__ import annotations

import json
import mmap
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from loraplex.bench.modes.setup import ModesBenchConfig, Setup, decode_step
from loraplex.model.adapter_weights import ModuleWeights
from loraplex.model.buffers import arena_mapping, weight_buffer
from loraplex.model.staged_merge import ARENA_ALIGN_BYTES, MergeStaging, StagedModule

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
MERGED_STEPS = 9  # decode steps timed on the merged weights (``merged_*`` modes: the median)
TILE_BYTES = 512 << 10  # float32 scratch per block in the tiled variant
PIECES = ("factors", "check", "alloc", "math", "write", "pack")
ALL_MODES = (
    "row",
    "between",
    "row_arena",
    "between_arena",
    "row_arenahuge",
    "between_arenahuge",
    "row_heap",
    "between_heap",
    "row_populate",
    "between_populate",
    "row_prefault",
    "between_prefault",
    "row_tiled",
    "between_tiled",
    "row_serial",
    "between_serial",
    "merged",
    "merged_arena",
    "merged_arenahuge",
)
DEFAULT_MODES = ("row", "between", "row_arena", "between_arena", "between_prefault")


_SCRATCH: list[torch.Tensor] = []


def _whole_scratch(weight: torch.Tensor) -> torch.Tensor:
    """A float32 view of ``weight``'s shape on one reused scratch (what ``MergeStaging`` did
    before stagecost: one module's whole float32 copy)."""
    if not _SCRATCH or _SCRATCH[0].numel() < weight.numel():
        _SCRATCH[:] = [weight_buffer((weight.numel(),), dtype=torch.float32, device=weight.device)]
    return _SCRATCH[0][: weight.numel()].view(weight.shape)


def _tiled_build(w, lora_a, lora_b, *, scale, out, clock) -> float:
    """``out = W + s B A`` in float32 row blocks of about ``TILE_BYTES`` (cache-sized): the
    math's time is folded into the write's (returns the time the math ended: here, at once)."""
    rows = max(1, TILE_BYTES // (w.shape[1] * 4))
    scratch = torch.empty((rows, w.shape[1]), dtype=torch.float32)
    for r in range(0, w.shape[0], rows):
        block = scratch[: min(rows, w.shape[0] - r)]
        block.copy_(w[r : r + rows])
        block.addmm_(lora_b[r : r + rows], lora_a, alpha=scale)
        out[r : r + rows].copy_(block)
    return clock()


def _timed_stager(
    staging: MergeStaging,
    parts: dict[str, float],
    outputs: list[torch.Tensor] | None,
    variant: str = "",
):
    """``staging._stage`` as written in model/staged_merge.py, each piece's time added to
    ``parts`` (seconds); ``variant`` (the mode's suffix) picks the output buffer and the math
    (see the module's docstring)."""

    def stage(module: ModuleWeights) -> StagedModule:
        clock = time.perf_counter
        linear = staging._linear_of(module.layer, module.module)
        original = linear.weight
        with torch.inference_mode(False), torch.no_grad():
            t0 = clock()
            lora_a = module.lora_a.to(original.device, torch.float32)
            lora_b = module.lora_b.to(original.device, torch.float32)
            t1 = clock()
            staging._check(module, original, lora_a, lora_b)
            t2 = clock()
            if variant in ("arena", "arenahuge", "populate"):
                out = staging._output(original)
                if variant == "populate":  # the kernel fills its pages in one call
                    _populate(staging, out)
            elif variant == "heap":
                out = torch.empty(original.shape, dtype=original.dtype)
            elif outputs is None:
                out = weight_buffer(
                    tuple(original.shape), dtype=original.dtype, device=original.device
                )
            else:
                out = outputs[staging._next]
            t3 = clock()
            if original.dtype == torch.float32:
                torch.addmm(original, lora_b, lora_a, alpha=module.scale, out=out)
                tm = clock()
            elif variant == "tiled":
                tm = _tiled_build(
                    original, lora_a, lora_b, scale=module.scale, out=out, clock=clock
                )
            else:
                scratch = _whole_scratch(original)
                scratch.copy_(original)
                scratch.addmm_(lora_b, lora_a, alpha=module.scale)
                tm = clock()
                out.copy_(scratch)
            t4 = clock()
            merged = nn.Parameter(out, requires_grad=False)
        staging.model.pack(merged)
        t5 = clock()
        first = parts.pop("_first", 0.0)
        parts["write_first" if first else "write_rest"] += t4 - tm
        for name, a, b in zip(
            PIECES, (t0, t1, t2, t3, tm, t4), (t1, t2, t3, tm, t4, t5), strict=True
        ):
            parts[name] += b - a
        return StagedModule(linear, original, merged)

    return stage


def _populate(staging: MergeStaging, out: torch.Tensor) -> None:
    """``MADV_POPULATE_WRITE`` (Linux 5.14) over ``out``'s pages of the staging's arena."""
    assert staging._arena is not None
    mapping = staging._arena[0]
    base = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    start = out.data_ptr() - base
    page = mmap.PAGESIZE
    low = start // page * page
    mapping.madvise(MADV_POPULATE_WRITE, low, start + out.nbytes - low)


def _huge_arena(staging: MergeStaging) -> None:
    """The staging's arena mapped now as ``MergeStaging._output`` would, but advised huge
    pages."""
    offsets, end = [], 0
    for module in staging.weights.modules:
        offsets.append(end)
        weight = staging._linear_of(module.layer, module.module).weight
        end += -(-weight.nbytes // ARENA_ALIGN_BYTES) * ARENA_ALIGN_BYTES
    mapping, start = arena_mapping(end, huge_pages=True)
    staging._arena = (mapping, [start + offset for offset in offsets])


def _prefaulted(staging: MergeStaging) -> list[torch.Tensor]:
    """Every module's output buffer, allocated and written once (its pages faulted in)."""
    outputs = []
    for module in staging.weights.modules:
        w = staging._linear_of(module.layer, module.module).weight
        out = weight_buffer(tuple(w.shape), dtype=w.dtype, device=w.device)
        out.fill_(0)
        outputs.append(out)
    return outputs


def _run(setup: Setup, step, mode: str, per_piece: int) -> dict[str, float]:
    staging = setup.begin_merge(0)
    parts = dict.fromkeys((*PIECES, "write_first", "write_rest"), 0.0)
    variant = mode.partition("_")[2]
    outputs = _prefaulted(staging) if variant == "prefault" else None
    if variant in ("arenahuge", "populate"):
        _huge_arena(staging)
    staging._stage = _timed_stager(staging, parts, outputs, variant)  # type: ignore[method-assign]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    totals = {"whole": 0.0}
    count = 0
    huge_share = None
    while not staging.done:
        if staging._arena is not None and staging._next == len(staging.weights.modules) - 1:
            huge_share = _huge_share(staging._arena[0])  # before the last module: still held
        if count % per_piece == 0:
            parts["_first"] = 1.0  # the write of a piece's first module: write_first
            if mode.startswith("between"):
                step(setup.pool)
        t = time.perf_counter()
        if mode.endswith("serial"):  # the module on the calling thread alone
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            staging.advance(0.0)
            torch.set_num_threads(threads)
        else:
            staging.advance(0.0)  # one module: advance's own path (estimate, bookkeeping) included
        totals["whole"] += time.perf_counter() - t
        count += 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    per_module = {k: v / count * 1000 for k, v in totals.items()}
    per_module["minflt"] = faults / count
    firsts = -(-count // per_piece)
    per_module.update({k: v / count * 1000 for k, v in parts.items()})
    per_module["write_first"] = parts["write_first"] / firsts * 1000
    per_module["write_rest"] = parts["write_rest"] / max(count - firsts, 1) * 1000
    if huge_share is not None:
        per_module["huge_share"] = huge_share
    if mode.startswith("merged"):  # the merged weights' decode step, then back
        applier = setup.commit(staging, 0)
        times = []
        for _ in range(MERGED_STEPS):
            t = time.perf_counter()
            step(applier)
            times.append(time.perf_counter() - t)
        per_module["merged_step_ms"] = statistics.median(times) * 1000
        setup.unmerge()
        return per_module
    setup.abandon(staging)
    return per_module


def _huge_share(mapping) -> float:
    """``AnonHugePages`` / ``Rss`` of the mapping ``mapping`` (its pages touched so far)."""
    address = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    fields: dict[str, int] = {}
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                low, high = (int(x, 16) for x in head[0].split("-"))
                inside = low <= address < high
            elif inside and head[0] in ("Rss:", "AnonHugePages:"):
                fields[head[0]] = int(head[1])
    return round(fields["AnonHugePages:"] / max(fields["Rss:"], 1), 3)


def _tiled_equal(setup: Setup) -> bool:
    """Whether the tiled build gives the very bits of the whole-module build, every module (a
    GEMM over a block of rows need not: MKL picks its kernel by the shape)."""
    staging = setup.begin_merge(0)
    same = True
    for module in staging.weights.modules:
        w = staging._linear_of(module.layer, module.module).weight
        a = module.lora_a.to(torch.float32)
        b = module.lora_b.to(torch.float32)
        whole = w.float().addmm_(b, a, alpha=module.scale).to(w.dtype)
        out = torch.empty_like(w)
        _tiled_build(w, a, b, scale=module.scale, out=out, clock=time.perf_counter)
        same = same and torch.equal(whole, out)
    setup.abandon(staging)
    return same


def main(preset: str, dtype: str, rounds: int, per_piece: int, modes: tuple[str, ...]) -> None:
    config = ModesBenchConfig(preset=preset, dtype=dtype, batch_size=20, context_tokens=32)
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp), config)
        slots: list[int | None] = [0] * 16 + [1, 2, 3, None]
        sys.stderr.write("setup done\n")
        step = decode_step(setup, slots)
        for _ in range(3):
            step(setup.pool)
        setup.merge(0)  # the merger reads each module's max |W| at its first merge only
        setup.unmerge()
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for _ in range(rounds):
            for mode in modes:
                runs[mode].append(_run(setup, step, mode, per_piece))
                sys.stderr.write(f"{mode} {runs[mode][-1]}\n")
        tiled_equal = _tiled_equal(setup) if any("tiled" in m for m in modes) else None
        t = time.perf_counter()
        for _ in range(5):
            step(setup.pool)
        step_ms = (time.perf_counter() - t) / 5 * 1000
    out: dict[str, object] = {"preset": preset, "dtype": dtype, "rounds": rounds}
    out["per_piece"] = per_piece
    out["kernel"] = setup.model.linear_kernel
    out["step_ms"] = round(step_ms, 1)
    out["tiled_equal"] = tiled_equal
    for mode, rows in runs.items():
        out[f"{mode}_ms_per_module"] = {
            k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]
        }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    chosen = tuple(sys.argv[5].split(",")) if len(sys.argv) > 5 else DEFAULT_MODES
    unknown = [m for m in chosen if m not in ALL_MODES]
    if unknown:
        raise SystemExit(f"modes {unknown} are unknown; expected some of {ALL_MODES}")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), chosen)
