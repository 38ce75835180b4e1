"""The four checks on every answer of a cell (docs/qualification.md, "The four checks").

- correct revision: of the answers the deployment gave (a 200 stream without an error event),
  the reported revision is one the alias named at send time, and a sampled answer's text equals
  that revision's offline reference. A refused or failed request (429, 503, a timeout, an error
  event) carries no revision to judge: it counts against availability (answered / sent), never
  as a wrong revision, and it is not a correct request (cost per correct request pays for it);
- quality: every probe of a revision the cell reached returns its expectation (the registered
  probe, or a generated adapter's own offline reference); a traffic answer passes when every
  probe of its adapter did;
- latency: TTFT within the warm objective when the adapter was leased from L0, else the cold
  one, and TPOT within its objective;
- isolation: the hostile tenant saw no foreign effect, and the victims' failures stay within
  the plan's bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.reference import Ask
from loraplex.qualify.traffic import CellRun, Sent

WARM_TIER = "L0"  # leased from a GPU slot: warm; any other tier: the answer waited for a load


def reference_asks(run: CellRun) -> list[Ask]:
    """The offline generations the cell's judgement needs."""
    asks: list[Ask] = []
    for sent in run.sent:
        if sent.kind == "probe" and sent.target.probe_expected is None:
            asks.extend(_ask(sent, d) for d in sent.target.revisions.values() if d is not None)
            asks.append(_ask(sent, None))  # the base model's answer: does the probe discriminate?
        elif sent.sampled and (local := _local_dir(sent)) is not None:
            asks.append(_ask(sent, local))
    return asks


def _ask(sent: Sent, adapter_dir: Path | None) -> Ask:
    return Ask(adapter_dir, sent.prompt, sent.max_tokens, sent.ignore_eos)


def _local_dir(sent: Sent) -> Path | None:
    revision = sent.answer.revision
    return None if revision is None else sent.target.revisions.get(revision)


@dataclass(frozen=True)
class CellVerdict:
    """One cell judged."""

    pass_ratios: dict[str, float | None]  # the four checks; None when nothing was judged
    correct_requests: int  # traffic requests answered that passed all four
    traffic_requests: int  # traffic requests sent
    answered: int  # traffic requests the deployment answered (200, no error event)
    failures: dict[str, int]  # refused or failed traffic requests by final status or error
    retries: int  # re-sends after a 429/503 with Retry-After, over the cell's traffic
    retried_requests: int  # traffic requests sent more than once
    passed: bool  # the cell meets every objective of the plan
    reasons: list[str]  # why it did not (empty when passed)
    quality: dict[str, dict[str, float | None]]  # revision -> pass_ratio, reference_score
    unverified_texts: int  # sampled answers whose revision's files are not on this machine
    # generated probes the bare base model answers exactly as the adapter (tell nothing apart;
    # left out of the comparators' probes)
    undiscriminating_probes: int
    ttft_warm_s: list[float] = field(default_factory=list)  # TTFTs leased from L0
    ttft_cold_s: list[float] = field(default_factory=list)  # TTFTs that waited for a load


def judge(run: CellRun, refs: dict[Ask, str], plan: QualifyPlan) -> CellVerdict:
    traffic = [s for s in run.sent if s.kind == "traffic"]
    probes = [s for s in run.sent if s.kind == "probe"]
    probe_ok = {id(p): _probe_passes(p, refs) for p in probes}
    alias_ok = {p.target.alias: True for p in probes}
    for p in probes:
        alias_ok[p.target.alias] &= probe_ok[id(p)]
    answered = [s for s in traffic if s.answer.answered]
    failures = len(traffic) - len(answered)
    breach = bool(run.hostile.breaches)
    within = failures <= plan.isolation.max_victim_failures
    rows = []
    unverified = 0
    for sent in traffic:
        revision_ok, checked = _revision_ok(sent, refs)
        unverified += 0 if checked else 1
        rows.append((
            revision_ok, alias_ok.get(sent.target.alias, False),
            _latency_ok(sent, plan), not breach and (sent.answer.answered or within),
        ))  # fmt: skip
    revisions_right = sum(_revision_ok(s, refs)[0] for s in answered)
    ratios = {
        "correct_revision": _ratio(revisions_right, len(answered)),
        "quality": _ratio(sum(probe_ok.values()), len(probes)),
        "latency": _ratio(sum(r[2] for r in rows), len(rows)),
        "isolation": _ratio(sum(r[3] for r in rows), len(rows)),
    }
    reasons = _reasons(ratios, run, plan, failures)
    if failures:
        reasons.append(f"availability_ratio {len(answered) / len(traffic)} < 1.0")
    warm = [
        s.answer.ttft_s
        for s in traffic
        if s.answer.ttft_s is not None and s.answer.tier == WARM_TIER
    ]
    cold = [
        s.answer.ttft_s
        for s in traffic
        if s.answer.ttft_s is not None and s.answer.tier != WARM_TIER
    ]
    return CellVerdict(
        ratios, sum(1 for r in rows if all(r)), len(rows), len(answered), _failures(traffic),
        sum(len(s.answer.retried) for s in traffic), sum(1 for s in traffic if s.answer.retried),
        not reasons, reasons, _quality_rows(probes, probe_ok, refs), unverified,
        sum(not discriminates(p, refs, p.answer.revision) for p in probes), warm, cold,
    )  # fmt: skip


def _failures(traffic: list[Sent]) -> dict[str, int]:
    """Refused or failed requests by what ended them: the HTTP status, else the error."""
    out: dict[str, int] = {}
    for sent in traffic:
        if not sent.answer.answered:
            answer = sent.answer
            why = str(answer.status) if answer.status not in (0, 200) else answer.error or "none"
            out[why] = out.get(why, 0) + 1
    return out


def _revision_ok(sent: Sent, refs: dict[Ask, str]) -> tuple[bool, bool]:
    """(passes, text checked): the deployment answered, the reported revision is one the alias
    named, and a sampled answer's text equals the reference when the revision's files are here."""
    answer = sent.answer
    if not answer.answered or answer.revision not in sent.target.revisions:
        return False, True
    local = sent.target.revisions[answer.revision]
    if not sent.sampled:
        return True, True
    if local is None:
        return True, False
    return answer.text == refs.get(_ask(sent, local)), True


def probe_expectation(probe: Sent, refs: dict[Ask, str], revision: str | None) -> str | None:
    """What ``revision``'s probe must answer: its registered expectation, else its offline
    reference; None without either (or for a revision the alias does not name)."""
    if revision is None or revision not in probe.target.revisions:
        return None
    if probe.target.probe_expected is not None:
        return probe.target.probe_expected.get(revision)
    local = probe.target.revisions[revision]
    return None if local is None else refs.get(_ask(probe, local))


def discriminates(probe: Sent, refs: dict[Ask, str], revision: str | None) -> bool:
    """Whether ``revision``'s probe tells the adapter from the base model: a generated probe's
    expectation (the adapter's offline reference) differs from the base model's own answer to
    the same prompt. A registered probe is taken as it was registered (True)."""
    if probe.target.probe_expected is not None:
        return True
    expected = probe_expectation(probe, refs, revision)
    base = refs.get(_ask(probe, None))
    return expected is not None and base is not None and expected != base


def _probe_passes(probe: Sent, refs: dict[Ask, str]) -> bool:
    answer = probe.answer
    expected = probe_expectation(probe, refs, answer.revision)
    return answer.status == 200 and expected is not None and answer.text == expected


def _quality_rows(
    probes: list[Sent], probe_ok: dict[int, bool], refs: dict[Ask, str]
) -> dict[str, dict[str, float | None]]:
    """Per revision answered: the probes' pass ratio and the offline reference's own score."""
    seen: dict[str, list[bool]] = {}
    score: dict[str, float | None] = {}
    for p in probes:
        ref = p.answer.revision or f"{p.target.alias}@?"
        seen.setdefault(ref, []).append(probe_ok[id(p)])
        local = p.target.revisions.get(ref)
        reference = None if local is None else refs.get(_ask(p, local))
        expected = probe_expectation(p, refs, p.answer.revision)
        score[ref] = None if reference is None or expected is None else float(reference == expected)
    return {
        ref: {"pass_ratio": sum(oks) / len(oks), "reference_score": score[ref]}
        for ref, oks in seen.items()
    }


def _latency_ok(sent: Sent, plan: QualifyPlan) -> bool:
    answer, objectives = sent.answer, plan.objectives
    if answer.status != 200 or answer.ttft_s is None:
        return False
    ttft_slo = objectives.ttft_warm_s if answer.tier == WARM_TIER else objectives.ttft_cold_s
    return answer.ttft_s <= ttft_slo and (
        answer.tpot_s is None or answer.tpot_s <= objectives.tpot_s
    )


def _ratio(passed: int, total: int) -> float | None:
    return None if total == 0 else passed / total


def _reasons(
    ratios: dict[str, float | None], run: CellRun, plan: QualifyPlan, failures: int
) -> list[str]:
    out = []
    if ratios["correct_revision"] != 1.0:
        out.append(f"correct_revision_ratio {ratios['correct_revision']} < 1.0")
    quality = ratios["quality"]
    if quality is None or quality < plan.objectives.min_quality_ratio:
        out.append(f"quality_ratio {quality} < {plan.objectives.min_quality_ratio}")
    latency = ratios["latency"]
    if latency is None or latency < plan.objectives.min_latency_ratio:
        out.append(f"latency_ratio {latency} < {plan.objectives.min_latency_ratio}")
    if ratios["isolation"] != 1.0:
        out.append(f"isolation_ratio {ratios['isolation']} < 1.0 ({failures} victim failures)")
    out.extend(f"isolation breach: {b}" for b in run.hostile.breaches)
    return out
