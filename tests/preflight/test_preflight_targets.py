"""The load test's adapters: one whose alias names only deprecated revisions serves nothing (a
404 by design) and is left out, said so in the load's note. It was load-tested, and its 404s
failed items 3 and 14 on any deployment ``loraplex qualify --url`` had run against (qualify
retires its generated adapters by deprecating them), seen 2026-12-06: 37 of 104 requests."""

from __future__ import annotations

from typing import Any

from loraplex.preflight.observe import RegistryView, _retired_note, targets


def _entry(name: str, states: dict[str, str], alias: list[str]) -> dict[str, Any]:
    revisions = [
        {"revision": r, "state": s, "adapter_digest": f"d-{name}-{r}", "warm_policy": "on_demand"}
        for r, s in states.items()
    ]
    targets_ = [{"revision": r, "weight": 1} for r in alias]
    return {
        "adapter": {"tenant": "acme", "name": name},
        "alias": {"targets": targets_},
        "revisions": revisions,
    }


def test_an_adapter_serving_no_revision_is_left_out_and_named() -> None:
    registry = RegistryView(
        [],
        [
            _entry("live", {"r1": "stable"}, ["r1"]),
            _entry("split", {"r1": "deprecated", "r2": "canary"}, ["r1", "r2"]),
            _entry("retired", {"q2": "deprecated"}, ["q2"]),
            _entry("other", {"r1": "stable"}, ["r1"]),
        ],
        False,
    )
    hot, tail, retired = targets(registry, {"acme": "k"}, {"acme/live": 3, "acme/split": 2})
    assert [t.model for t in hot] == ["acme/live", "acme/split"]
    assert [t.model for t in tail] == ["acme/other"]
    assert hot[1].digests == {"acme/split@r2": "d-split-r2"}  # the deprecated one is not asked
    assert retired == ["acme/retired"]
    assert _retired_note(retired) == (
        "; 1 adapters not load-tested, every revision their alias names deprecated (acme/retired)"
    )
    assert _retired_note([]) == ""
