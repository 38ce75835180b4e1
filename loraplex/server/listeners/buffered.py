"""``BufferedAnswers``: answer bytes a connection's app holds for its client beyond the
transport, so that ``max_unsent_response_bytes`` bounds them with the transport's
(``unsent.UnsentLedger``).

A stream's writer hands the transport one slice at a time (``stream_buffer.py``): what its client
has not taken yet waits in the stream's read-ahead buffer and in the piece the writer is slicing,
where the ledger saw none of it. The counted events there are bounded per stream
(``max_stream_buffer_bytes``), but a choice's first event under ``echo`` is not: 4.68 MB for 16
choices of a 483-token prompt with ``logprobs: 20`` on the demo model, and more with a longer
context. NOTE: six such streams whose clients read nothing held 28 MB beside a cap of 8 MiB
(``loraplex_unsent_response_bytes`` 3.7 MB, nothing cut), where the same six requests
non-streamed were held to the cap (4 cut): the cap bounded a non-streamed answer whole and a
stream's slice only (attack round 17, ``docs/benchmarks/attack17.md``).

The listener hands each request a connection's ``BufferedAnswers`` in its scope state
(``BUFFERED_ANSWERS``); a stream adds a source of its buffered bytes while it runs and says when
they grew, so a held connection is measured again at once (``protocol.BoundedH11Protocol``), and
stays held across its transport's refills while its app still buffers bytes for it (each slice
filled and drained the transport: held anew each time, a stream never showed a pace, so a
newcomer past the cap was cut in its place).
Event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# The scope state key under which the listener leaves the connection's ``BufferedAnswers``
# (absent outside ``loraplex serve``'s listener, e.g. in TestClient).
BUFFERED_ANSWERS = "loraplex_buffered_answers"


class BufferedAnswers:
    """The bytes one connection's app holds for its client beyond the transport: the sum of the
    sources its running answers added."""

    def __init__(self, changed: Callable[[], None]) -> None:
        self._changed = changed  # the connection's: its buffered bytes changed
        self._sources: list[Callable[[], int]] = []

    @contextmanager
    def source(self, num_bytes: Callable[[], int]) -> Iterator[None]:
        """``num_bytes()`` counts while the block runs (one answer's buffered bytes)."""
        self._sources.append(num_bytes)
        try:
            yield
        finally:
            self._sources.remove(num_bytes)
            self._changed()

    def grew(self) -> None:
        """A source holds more than it did."""
        self._changed()

    def num_bytes(self) -> int:
        return sum(source() for source in self._sources)


def buffered_answers(state: Mapping[str, Any]) -> BufferedAnswers | None:
    """The connection's ``BufferedAnswers`` from a request's scope state; None outside the
    listener."""
    found = state.get(BUFFERED_ANSWERS)
    return found if isinstance(found, BufferedAnswers) else None
