"""The matrix: cells formed from the plan's axes, and each cell's traffic (which adapter each
request names, in send order).

``factorial`` runs every combination (4 x 3 x 3 x 4 = 144 cells with every level). ``covering``
runs max(levels) cells, cell i taking level i mod n of each axis: every level of every axis is
run at least once, in as few cells as the longest axis (docs/qualification.md, "Cells").
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from loraplex.bench.workloads import HOT_BURST_WINDOW, zipf_weights
from loraplex.qualify.cost import TOKEN_SHAPES, TokenShape
from loraplex.qualify.plan import MatrixPlan

HOT_SET = 8  # hot-burst's hot adapters (WORKLOADS.md): a steady 80 % of the traffic
HOT_SHARE = 0.8


@dataclass(frozen=True)
class Cell:
    """One point of the matrix."""

    active_adapters: int  # adapters the traffic is drawn from
    rank_distribution: str  # plan.RANK_DISTRIBUTIONS name
    shape: TokenShape  # prompt and output tokens per request
    popularity: str  # plan.POPULARITIES name

    @property
    def cell_id(self) -> str:
        return (
            f"a{self.active_adapters}-{self.rank_distribution}-{self.shape.name}-{self.popularity}"
        )


def cells(matrix: MatrixPlan) -> list[Cell]:
    """The plan's cells, in run order."""
    active, ranks, popularities = (
        matrix.active_adapters,
        matrix.rank_distributions,
        matrix.popularities,
    )
    shapes = tuple(TOKEN_SHAPES[name] for name in matrix.token_shapes)
    if matrix.design == "factorial":
        return [Cell(*combo) for combo in itertools.product(active, ranks, shapes, popularities)]
    width = max(len(active), len(ranks), len(shapes), len(popularities))
    return [
        Cell(
            active[i % len(active)],
            ranks[i % len(ranks)],
            shapes[i % len(shapes)],
            popularities[i % len(popularities)],
        )
        for i in range(width)
    ]


def adapters_needed(all_cells: list[Cell]) -> dict[str, int]:
    """Rank distribution -> the most active adapters a cell of it draws from."""
    needed: dict[str, int] = {}
    for cell in all_cells:
        needed[cell.rank_distribution] = max(
            needed.get(cell.rank_distribution, 0), cell.active_adapters
        )
    return needed


def draw_indices(cell: Cell, requests: int, rng: random.Random) -> list[int]:
    """Which of the cell's active adapters (0 = most popular) each request names, in order."""
    n = cell.active_adapters
    if cell.popularity == "uniform":
        return [rng.randrange(n) for _ in range(requests)]
    if cell.popularity.startswith("zipf-"):
        weights = zipf_weights(n, float(cell.popularity.removeprefix("zipf-")))
        return rng.choices(range(n), weights, k=requests)
    return _hot_burst(n, requests, rng)


def _hot_burst(n: int, requests: int, rng: random.Random) -> list[int]:
    """WORKLOADS.md's hot-burst over ``n`` adapters: the first ``HOT_SET`` carry 80 % of the
    traffic; during HOT_BURST_WINDOW of the run the rest are swept, each once, in order (the
    cold burst). With n <= HOT_SET there is nothing cold to sweep: the hot set alone."""
    hot = min(HOT_SET, n)
    cold = list(range(hot, n))
    start, end = (int(share * requests) for share in HOT_BURST_WINDOW)
    picks = []
    sweep = iter(cold)
    for i in range(requests):
        if cold and start <= i < end:
            nxt = next(sweep, None)
            if nxt is None:  # more burst requests than cold adapters: sweep again
                sweep = iter(cold)
                nxt = next(sweep)
            picks.append(nxt)
        elif cold and rng.random() > HOT_SHARE:
            picks.append(rng.choice(cold))
        else:
            picks.append(rng.randrange(hot))
    return picks
