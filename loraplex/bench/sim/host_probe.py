"""The host-speed probe (``sim/host_speed.HostProbe``): a fixed torch matmul loop on one thread
and a fixed Python loop, each about 0.3 s on the 2-core demo machine, timed ``repeats`` times
and kept as medians. Fixed inputs (a seeded generator, constant sizes), so two probes differ
only by the host's speed; ``sim calibrate`` records one beside its figures and ``bench sim``
times one right before each real run it validates against."""

from __future__ import annotations

import statistics
import time

import torch

from loraplex.sim.host_speed import HostProbe

MATMUL_SIZE = 256  # square float32 operands
MATMUL_ITERS = 1500
LOOP_ITERS = 5_000_000
REPEATS = 3


def _matmul_s() -> float:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the demo server's engine runs torch on one thread
    try:
        start = time.perf_counter()
        for _ in range(MATMUL_ITERS):
            torch.mm(a, b)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def _loop_s() -> float:
    total = 0
    start = time.perf_counter()
    for i in range(LOOP_ITERS):
        total += i * i & 7
    elapsed = time.perf_counter() - start
    if total < 0:  # never: keeps the loop's result used
        raise RuntimeError("host probe loop overflowed")
    return elapsed


def host_probe(repeats: int = REPEATS) -> HostProbe:
    """The probe's medians over ``repeats`` timings of each part."""
    if repeats < 1:
        raise ValueError(f"repeats {repeats} is invalid; expected >= 1")
    matmul = [_matmul_s() for _ in range(repeats)]
    loop = [_loop_s() for _ in range(repeats)]
    return HostProbe(statistics.median(matmul), statistics.median(loop))
