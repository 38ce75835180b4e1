"""The calibrated step line names the shapes it was fitted over: under ``--url`` the adapters'
bytes are read during ``measure`` (``with_sizes``), and the line said ``x 0 target sets`` from
the unsized target (newop4)."""

from __future__ import annotations

import pytest

from loraplex.bench.sim import interleaved
from loraplex.bench.sim.calibrate_fit import _shapes
from loraplex.bench.sim.calibrate_target import ServedAdapter, Target


def _target(*adapters: ServedAdapter) -> Target:
    return Target("http://x", "k", adapters, {}, 100)


def test_the_sizes_measure_read_count_the_target_sets() -> None:
    a8 = ServedAdapter("acme", "a", "r1", 8)
    a64 = ServedAdapter("acme", "b", "r1", 64)
    b8 = ServedAdapter("globex", "c", "r1", 8)
    remote = _target(a8, a64, b8)  # --url: no sizes until measure reads them
    sizes = {a8.ref: 8 * 1000, a64.ref: 64 * 1000, b8.ref: 8 * 3000}  # 2 bytes-per-rank widths
    assert _shapes(remote, sizes) == "ranks [8, 64] x 2 target sets (bytes per rank)"
    assert _shapes(remote, {}) == "ranks [8, 64] (their bytes not known: target sets not counted)"
    sized = _target(ServedAdapter("acme", "a", "r1", 8, 8000))  # --self: sizes given
    assert _shapes(sized, {}) == "ranks [8] x 1 target sets (bytes per rank)"


def test_passes_merged_keep_the_sizes_they_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interleaved, "fit_step", lambda steps: None)  # no samples to fit here
    lists = {key: [] for key in interleaved.LISTS}
    one = {**lists, "sizes": {"acme/a@r1": 8000}, "front_s": 0.001}
    two = {**lists, "sizes": {"acme/b@r1": 64000}, "front_s": 0.003}
    out = interleaved.merged([one, two])
    assert out["sizes"] == {"acme/a@r1": 8000, "acme/b@r1": 64000}
