"""The order benchmark runs take, so machine drift and warm-up favour no side."""

from __future__ import annotations

from collections.abc import Sequence


def run_order(group_sizes: Sequence[int], repeats: int) -> list[tuple[int, int]]:
    """(group, member) in run order: each group's members run ``repeats`` times, the order
    reversed every other repeat and every other group (ABBA, then BAAB), so machine drift and
    warm-up do not favour one side."""
    order = []
    for group, size in enumerate(group_sizes):
        for repeat in range(repeats):
            members = range(size)
            order += [(group, m) for m in (members[::-1] if (group + repeat) % 2 else members)]
    return order
