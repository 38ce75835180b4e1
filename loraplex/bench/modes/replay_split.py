"""Where a replay's wall time goes, ``auto`` against unmerged, step by step (issue 28;
docs/modes.md, twenty-second pass).

Both modes of one trace run the same steps (who runs in which step depends only on step counts,
bench/modes/replay.py), so step ``i`` of an ``auto`` replay and step ``i`` of an unmerged one did
the same work (:class:`StepRecord`, recorded by the replay). Each ``auto`` step gets a kind from
what it ran (:func:`step_kind`); its forward is set against the mean forward of the unmerged
replays' same step. Per kind: the steps, both modes'
seconds and unmerged / ``auto`` (the kind's gain). Outside the forwards: ``auto``'s decisions and
transitions, and the bookkeeping between steps, per mode. The replay is one thread in one
process: no HTTP, no client, nothing idle between steps but that bookkeeping.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """What one replay step ran and where its wall time went (``replay_split.py`` adds them up;
    a few clock reads a step, so it is always recorded)."""

    decide_s: float  # auto's decision and any transition before the step (0: unmerged)
    forward_s: float  # the forward itself
    bookkeeping_s: float  # after the forward: auto's accounting, picks, the clients' next requests
    num_sequences: int  # requests in the step
    prefill_tokens: int  # prompt tokens (new requests' whole prompts)
    decode_tokens: int  # running requests' last tokens
    hot_prefill_tokens: int  # prompt tokens of the hot revision
    hot_decode_tokens: int  # decode tokens of the hot revision
    merged: bool  # ran with a revision merged (auto)


# In the order a replay meets them: the opening burst (step 0, every client's prompt), the
# unmerged steps before ``auto``'s first merge, then merged steps by what they carry: a prompt of
# another revision (its whole chunk takes the negative pass), prompts of the hot revision only
# (decode tokens of others beside them), decode tokens only, with or without another revision's;
# last, unmerged steps after a merge (an unmerge: none expected on the 80 % trace).
KINDS = (
    "opening",
    "before_merge",
    "merged_foreign_prompt",
    "merged_hot_prompt",
    "merged_decode_foreign",
    "merged_decode_hot_only",
    "unmerged_after_merge",
)


def step_kind(index: int, record: StepRecord, merged_yet: bool) -> str:
    """The kind of an ``auto`` replay's step ``index``; ``merged_yet``: a merge came before it."""
    if index == 0:
        return "opening"
    if not record.merged:
        return "unmerged_after_merge" if merged_yet else "before_merge"
    if record.prefill_tokens > record.hot_prefill_tokens:
        return "merged_foreign_prompt"
    if record.prefill_tokens:
        return "merged_hot_prompt"
    foreign = record.decode_tokens > record.hot_decode_tokens
    return "merged_decode_foreign" if foreign else "merged_decode_hot_only"


def time_split(unmerged: list[list[StepRecord]], auto: list[list[StepRecord]]) -> dict[str, object]:
    """Per kind: ``steps`` (over all ``auto`` replays), ``auto_s``, ``unmerged_s`` (the same steps'
    mean unmerged forwards, as often), ``gain`` (unmerged_s / auto_s); and per mode the seconds
    of decisions (transitions included) and of bookkeeping, over all its replays. Raises
    ValueError when the replays did not run the same steps."""
    if not unmerged or not auto or len({len(log) for log in unmerged + auto}) != 1:
        raise ValueError("time_split needs replays of one trace, both modes, the same steps")
    steps = zip(*unmerged, strict=True)
    base = [statistics.fmean(record.forward_s for record in step) for step in steps]
    kinds = {kind: {"steps": 0, "auto_s": 0.0, "unmerged_s": 0.0} for kind in KINDS}
    for log in auto:
        merged_yet = False
        for index, record in enumerate(log):
            merged_yet = merged_yet or record.merged
            row = kinds[step_kind(index, record, merged_yet)]
            row["steps"] += 1
            row["auto_s"] += record.forward_s
            row["unmerged_s"] += base[index]
    out: dict[str, object] = {
        kind: {**row, "gain": row["unmerged_s"] / row["auto_s"] if row["auto_s"] else None}
        for kind, row in kinds.items()
    }
    for name, logs in (("unmerged", unmerged), ("auto", auto)):
        records = [record for log in logs for record in log]
        out[f"{name}_decide_s"] = sum(r.decide_s for r in records)
        out[f"{name}_forward_s"] = sum(r.forward_s for r in records)
        out[f"{name}_bookkeeping_s"] = sum(r.bookkeeping_s for r in records)
    return out
