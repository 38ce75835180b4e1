"""Output probes: greedy completions that must pass before any tenant traffic reaches a
candidate. The revision's own probe (registered with it) always runs; the plan adds more."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from loraplex.artifacts.identity import AdapterKey
from loraplex.errors import clipped
from loraplex.registry.models import Revision
from loraplex.release.env import ReleaseEnv
from loraplex.release.model import ProbeCase, check_plan_bounds

T = TypeVar("T")

# Tokens generated for the revision's own probe: enough for its expected continuation (a token
# is at least one character of it, so its length in characters bounds its length in tokens).
_MIN_OWN_PROBE_TOKENS = 16


@dataclass(frozen=True)
class ProbeRun:
    """Probes in flight: one candidate completion per case, and stable's where compared."""

    cases: tuple[ProbeCase, ...]
    candidate: tuple[Future[str], ...]  # aligned with cases
    stable: tuple[Future[str] | None, ...]  # aligned with cases; None: not compared

    def done(self) -> bool:
        futures = [*self.candidate, *(f for f in self.stable if f is not None)]
        return all(future.done() for future in futures)


def probe_cases(revision: Revision, extra: tuple[ProbeCase, ...]) -> tuple[ProbeCase, ...]:
    """The revision's own probe, then ``extra``. Raises ``ValueError`` when ``extra`` is over
    the bounds (``check_plan_bounds``: a plan stored before they held), before any runs."""
    check_plan_bounds((), extra)
    own: tuple[ProbeCase, ...] = ()
    if revision.probe_prompt is not None and revision.expected_continuation is not None:
        expected = revision.expected_continuation
        tokens = max(_MIN_OWN_PROBE_TOKENS, len(expected))
        own = (ProbeCase(revision.probe_prompt, expected, max_tokens=tokens),)
    return own + extra


def unprobed_warning(revision: Revision, extra: tuple[ProbeCase, ...]) -> str | None:
    """What ``release start`` says when ``probe_cases`` would be empty: probing then passes with
    nothing run, and the first tenant traffic the candidate sees is the canary's. NOTE: a
    revision uploaded without ``probe_prompt`` / ``expected_continuation`` (the README's own
    adapter) went from ``probing`` to ``canary`` in silence, where the docs promise a release
    only after an output probe passed."""
    if extra or (revision.probe_prompt is not None and revision.expected_continuation is not None):
        return None
    return (
        f"{revision.ref} has no output probe (it was registered without probe_prompt and "
        "expected_continuation) and the plan adds none: probing runs nothing and the canary "
        "starts on the server's first tick; give --probe-file (POST /admin/releases: probes) "
        'with lines such as {"prompt": "...", "expected": "..."} or {"prompt": "...", '
        '"differ_from_stable": true} to test its output first'
    )


def launch(
    env: ReleaseEnv,
    cases: tuple[ProbeCase, ...],
    tenant: str,
    candidate: AdapterKey,
    baseline: AdapterKey,
) -> ProbeRun:
    def run(key: AdapterKey, case: ProbeCase) -> Future[str]:
        return called(lambda: env.probe(key, tenant, case.prompt, case.max_tokens))

    mine = tuple(run(candidate, case) for case in cases)
    theirs = tuple(run(baseline, case) if case.differ_from_stable else None for case in cases)
    return ProbeRun(cases, mine, theirs)


def called(start: Callable[[], Future[T]]) -> Future[T]:
    """``start()``, or a failed future when it raises at once (an error the environment
    reports synchronously is the same failure as one it reports later)."""
    try:
        return start()
    except Exception as exc:
        failed: Future[T] = Future()
        failed.set_exception(exc)
        return failed


def first_failure(run: ProbeRun) -> str | None:
    """Why the first failing probe failed, for the release's ``reason``; None when all pass."""
    for index, case in enumerate(run.cases):
        label = f"probe {index} (prompt {clipped(case.prompt)!r})"
        try:
            got = run.candidate[index].result(timeout=0)
            stable_future = run.stable[index]
            stable = None if stable_future is None else stable_future.result(timeout=0)
        except Exception as exc:  # the probe itself failed: that is a failed probe
            return f"{label} failed to run: {exc}"
        if case.expected is not None and not got.startswith(case.expected):
            return (
                f"{label} continued with {clipped(got)!r}; expected it to start with "
                f"{clipped(case.expected)!r}"
            )
        if stable is not None and got == stable:
            return f"{label} continued with {clipped(got)!r}, the same as the stable revision"
    return None
