"""What each cycle of ``loraplex bench release`` releases, decided before any traffic runs.

A cycle registers a new revision label (``c07``) of one of the demo adapters that have several
revisions, built from the files of one of its demo revisions, and releases it. The demo
revisions of one adapter answer the shared probe prompt with different continuations, so the
bench always knows which files answered: that is what the wrong-revision check relies on.

Kinds (one cycle in three is bad, the bad ones alternating):

- ``good``: files of a demo revision whose continuation differs from the current stable one's,
  registered with that revision's own continuation as its probe; it should be promoted.
- ``live_fail``: the same, so its probe passes, but the bench's clients reject its answers (they
  keep expecting the stable revision's continuation) and say so through ``POST /v1/feedback``;
  the feedback threshold should roll it back during the canary.
- ``probe_fail``: files of one demo revision registered with the continuation of another as
  its expected probe output; the output probe should fail before any traffic reaches it.

Torch-free and deterministic: the kinds and adapters follow from the cycle index alone; the
files follow from the stable revision at the time the cycle starts (``choose_sources``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class CycleKind(StrEnum):
    GOOD = "good"
    LIVE_FAIL = "live_fail"
    PROBE_FAIL = "probe_fail"

    @property
    def bad(self) -> bool:
        return self is not CycleKind.GOOD


@dataclass(frozen=True)
class Lineage:
    """A demo adapter with several revisions: what a cycle can build a candidate from."""

    tenant: str  # owning tenant
    name: str  # adapter name
    continuations: dict[str, str]  # demo revision label -> its probe continuation (2 at least)

    @property
    def adapter(self) -> str:
        return f"{self.tenant}/{self.name}"


@dataclass(frozen=True)
class CycleSpec:
    """Which adapter a cycle releases and how it is meant to end (files chosen later)."""

    index: int  # 0-based position in the run
    lineage: Lineage  # the adapter released
    kind: CycleKind  # good or one of the two bad kinds
    label: str  # the new revision label, e.g. "c07"


@dataclass(frozen=True)
class Sources:
    """Where a candidate's files and its registered probe continuation come from."""

    files_from: str  # demo revision whose adapter files are registered
    probe_from: str  # demo revision whose continuation is registered as the expected probe


def cycle_kind(index: int) -> CycleKind:
    """Cycles 1, 4, 7, ... are bad; the bad ones alternate live-fail, probe-fail."""
    if index % 3 != 1:
        return CycleKind.GOOD
    return CycleKind.LIVE_FAIL if (index // 3) % 2 == 0 else CycleKind.PROBE_FAIL


def plan_cycles(num_cycles: int, lineages: tuple[Lineage, ...]) -> tuple[CycleSpec, ...]:
    """``num_cycles`` cycles, round-robin over ``lineages`` (one release per alias at a time,
    and the cycles run one after another)."""
    if num_cycles < 1:
        raise ValueError(f"num_cycles {num_cycles} is invalid; expected >= 1")
    if not lineages:
        raise ValueError("lineages is empty; expected at least one multi-revision adapter")
    for lineage in lineages:
        if len(set(lineage.continuations.values())) < 2:
            raise ValueError(
                f"lineage {lineage.adapter} is invalid; expected 2 revisions at least with "
                "different probe continuations"
            )
    return tuple(
        CycleSpec(i, lineages[i % len(lineages)], cycle_kind(i), f"c{i:02d}")
        for i in range(num_cycles)
    )


def choose_sources(spec: CycleSpec, stable_source: str) -> Sources:
    """The candidate's files and probe source, given the demo revision whose files the alias's
    stable revision has: the files always answer differently from stable (so a canary answer
    is told apart from a stable one), and a probe-fail's registered probe is a third text."""
    texts = spec.lineage.continuations
    stable_text = texts[stable_source]
    others = sorted(label for label, text in texts.items() if text != stable_text)
    # Rotate through the other revisions so successive cycles do not all use the same files.
    files_from = others[spec.index % len(others)]
    if spec.kind is not CycleKind.PROBE_FAIL:
        return Sources(files_from, files_from)
    wrong = sorted(label for label, text in texts.items() if text != texts[files_from])
    return Sources(files_from, wrong[spec.index % len(wrong)])
