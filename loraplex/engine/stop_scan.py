"""The search for stop strings in a request's growing output text (``OutputTracker``), done
once per token on the engine thread that steps every tenant: each search covers only the text
added or rewritten since the last one (torch-free)."""

from __future__ import annotations


class StopScan:
    """The earliest stop string in a growing text that ends past ``floor``, and where it
    starts (the first listed wins a tie), searching each call only where a match could end in
    text that is new since the last call.

    A call that found no match leaves the text it searched: the next text's common prefix with
    it (``_kept``) holds no match ending past the same floor, so each stop string is searched
    from where a match of it could end past that prefix. The text usually extends the last one
    (one ``startswith``, no copy); where it does not (the decoder replaced a trailing
    replacement character, ``CleanedText`` cleaned its pending piece again, ``IncrementalText``
    decoded whole), the prefix both share is found from their last difference, so only the
    rewritten tail is searched again. NOTE: every call searched every stop string from the
    floor, O(output length) per token and O(n^2) per request on the engine thread every tenant
    shares (attack28, attack30; docs/benchmarks/attack30.md "Later: the stop scan")."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._seen: str | None = None  # the text the last call searched and found no match in
        self._floor = 0  # the floor of that call

    def match(self, text: str, floor: int) -> tuple[int, str] | None:
        """(start, stop string) of the earliest match in ``text`` ending past ``floor``."""
        if not self._stops:
            return None
        seen = self._seen
        kept = 0 if seen is None or floor != self._floor else _kept(seen, text)
        best: tuple[int, str] | None = None
        for stop in self._stops:
            start = max(0, floor - len(stop) + 1, kept - len(stop) + 1)
            # a match starting after the best so far cannot win: stop the search there
            end = len(text) if best is None else best[0] + len(stop)
            i = text.find(stop, start, end)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, stop)
        self._seen, self._floor = (text, floor) if best is None else (None, 0)
        return best


def _kept(seen: str, text: str) -> int:
    """A length of prefix that ``seen`` and ``text`` share: all of ``seen`` when ``text``
    extends it, else up to their last difference among the last 64 characters of the shorter
    length (a rewrite is near the end), checked with one comparison; backing off 64, 128, ...
    characters more while the check fails (a rewrite further back), 0 at worst."""
    if text.startswith(seen):
        return len(seen)
    n = min(len(seen), len(text))
    kept = n
    for i in range(n - 1, max(n - 65, -1), -1):
        if text[i] != seen[i]:
            kept = i
            break
    step = 64
    while kept > 0 and not text.startswith(seen[:kept]):
        kept = max(0, kept - step)
        step *= 2
    return kept
