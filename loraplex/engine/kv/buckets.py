"""Length buckets for decode attention: which one-token sequences gather and attend together.

Gathering every decode sequence's rows padded to the longest of them wastes most of the work
when lengths are mixed (a few long contexts beside many short ones); one gather and attention
call per bucket of similar lengths pads each row only to its bucket's longest. Each extra bucket
costs a fixed overhead per layer (one more gather, one more attention call, a scatter back), so
``partition_by_length`` trades padded positions against that overhead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import pairwise

MAX_DECODE_BUCKETS = 4
# What one more bucket costs, in padded positions. Measured with 1 torch thread on the 2-core dev
# machine, the demo model's attention shape (8 heads, 2 kv heads, head_dim 32, float32 storage of
# 9,600 rows): one bucket's per-layer work (gather its queries, gather its keys/values, SDPA under
# its mask, scatter back) took 50 us at 1 row x 16 positions, 164 us at 16 x 64, 383 us at
# 16 x 400, 868 us at 26 x 496; a least-squares line gives 77 us + 60 ns per padded position,
# i.e. one bucket ~ 1,300 positions (~ 830 from the 1-row point alone).
BUCKET_OVERHEAD_POSITIONS = 1024


def partition_by_length(
    lengths: Sequence[int],
    *,
    max_buckets: int = MAX_DECODE_BUCKETS,
    overhead: int = BUCKET_OVERHEAD_POSITIONS,
) -> tuple[tuple[int, ...], ...]:
    """Indices into ``lengths`` in buckets, shortest first, each bucket's indices ascending.

    The buckets cut the length-sorted indices into at most ``max_buckets`` contiguous runs that
    minimise ``sum(len(bucket) * max length in bucket) + overhead * num_buckets`` (ties: fewer
    buckets). Equal lengths always share a bucket. An O(n) check first returns one bucket
    whenever no split could save more than one bucket's overhead (uniform or near-uniform
    lengths); otherwise a DP over the distinct lengths, O(n log n + max_buckets * distinct).
    """
    if max_buckets < 1:
        raise ValueError(f"max_buckets={max_buckets} must be >= 1")
    n = len(lengths)
    if n == 0:
        return ()
    longest = max(lengths)
    if max_buckets == 1 or n * longest - sum(lengths) <= overhead:
        return (tuple(range(n)),)
    order = sorted(range(n), key=lengths.__getitem__)
    distinct: list[int] = []  # the distinct lengths, ascending
    upto: list[int] = []  # upto[j]: how many rows have a length <= distinct[j]
    for i in order:
        if distinct and lengths[i] == distinct[-1]:
            upto[-1] += 1
        else:
            distinct.append(lengths[i])
            upto.append((upto[-1] if upto else 0) + 1)
    starts = _best_starts(distinct, upto, max_buckets, overhead)
    bounds = [0, *(upto[s - 1] for s in starts[1:]), n]
    return tuple(tuple(sorted(order[a:b])) for a, b in pairwise(bounds))


def _best_starts(
    distinct: list[int], upto: list[int], max_buckets: int, overhead: int
) -> list[int]:
    """The first distinct-length index of each bucket of the cheapest partition.

    ``cost_k[j] = overhead + min over i of cost_{k-1}[i-1] + (upto[j] - upto[i-1]) * distinct[j]``:
    for each start ``i`` a line in ``x = distinct[j]`` with slope ``-upto[i-1]``, so the min is
    the lower envelope of lines added with falling slopes and queried at rising ``x`` (a monotone
    convex hull trick): O(max_buckets * distinct), exact in integers.
    """
    m = len(distinct)
    # cost[j]: least cost of the rows up to distinct[j] in k buckets; start[k-1][j]: the first
    # distinct index of the k-th (last) of those buckets.
    cost = [upto[j] * distinct[j] + overhead for j in range(m)]
    start = [[0] * m]
    best_k, best = 1, cost[m - 1]
    for k in range(2, min(max_buckets, m) + 1):
        new, cut = [0] * m, [0] * m
        hull: deque[tuple[int, int, int]] = deque()  # (slope, intercept, start i)
        for j in range(k - 1, m):
            line = (-upto[j - 1], cost[j - 1], j)  # the bucket that starts at distinct[j]
            while len(hull) >= 2 and _useless(hull[-2], hull[-1], line):
                hull.pop()
            hull.append(line)
            x = distinct[j]
            while len(hull) >= 2 and _at(hull[1], x) <= _at(hull[0], x):
                hull.popleft()
            new[j], cut[j] = _at(hull[0], x) + upto[j] * x + overhead, hull[0][2]
        cost = new
        start.append(cut)
        if cost[m - 1] < best:
            best_k, best = k, cost[m - 1]
    starts = []
    j = m - 1
    for k in range(best_k, 0, -1):
        starts.append(start[k - 1][j])
        j = start[k - 1][j] - 1
    return starts[::-1]


def _at(line: tuple[int, int, int], x: int) -> int:
    return line[0] * x + line[1]


def _useless(a: tuple[int, int, int], b: tuple[int, int, int], c: tuple[int, int, int]) -> bool:
    """Whether ``b`` is nowhere below both ``a`` and ``c`` (slopes a > b > c)."""
    return (c[1] - a[1]) * (a[0] - b[0]) <= (b[1] - a[1]) * (a[0] - c[0])
