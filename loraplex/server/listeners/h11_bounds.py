"""h11's server connection bounded where h11 is not: the whole request head and the chunks of a
chunked body (``BoundedConnection``)."""

from __future__ import annotations

from typing import Any, NoReturn

import h11

CHUNK_ALLOWANCE_BYTES = 1024  # each KiB of a chunked body allows one more chunk


class BoundedConnection(h11.Connection):
    """h11's server connection, bounded where h11 is not, each refusal a 400 and a close:

    - a complete request head longer than ``max_incomplete_event_size``: h11 measures only a
      head still waiting for its end, so one that arrived whole in a single read (up to the
      transport's read size, ~100-200 KiB on loopback) passed ``max_header_bytes`` unchecked;
    - a chunked body of more than ``max_body_chunks`` chunks plus one per
      ``CHUNK_ALLOWANCE_BYTES`` of body (so a large upload in chunks of 1 KiB or more always
      passes). NOTE: uvicorn appends each chunk to the body received so far (``cycle.body +=
      data``, a copy of all of it), so a body in 1-byte chunks cost time quadratic in the chunks
      of one socket read, on the event loop (about a second per read of a 2 MB body sent that
      way, 12 MB on the wire).

    ``refusal`` says which, for the 400's text (uvicorn's own is "Invalid HTTP request")."""

    def __init__(self, max_header_bytes: int, max_body_chunks: int) -> None:
        super().__init__(h11.SERVER, max_header_bytes)
        self._max_body_chunks = max_body_chunks
        self._num_chunks = 0  # chunks of the current request's body so far
        self._num_body_bytes = 0  # and their bytes
        self.refusal: str | None = None  # why this connection's request was refused

    def next_event(self) -> Any:
        before = len(self._receive_buffer)
        event = super().next_event()
        if isinstance(event, h11.Request):
            self._num_chunks = self._num_body_bytes = 0
            head_bytes = before - len(self._receive_buffer)
            if head_bytes > self._max_incomplete_event_size:
                self._refuse(
                    f"request head of {head_bytes} bytes exceeds max_header_bytes "
                    f"{self._max_incomplete_event_size}"
                )
        elif isinstance(event, h11.Data):
            self._num_body_bytes += len(event.data)
            self._num_chunks += event.chunk_start
            allowed = self._max_body_chunks + self._num_body_bytes // CHUNK_ALLOWANCE_BYTES
            if self._num_chunks > allowed and self.our_state is h11.SEND_RESPONSE:
                self._refuse(
                    f"request body in more than max_body_chunks {self._max_body_chunks} chunks "
                    f"plus one per {CHUNK_ALLOWANCE_BYTES} bytes; send larger chunks or a "
                    "Content-Length body"
                )
        return event

    def _refuse(self, reason: str) -> NoReturn:
        # NOTE: the client's state stays as it was: mid-body, the close lingers and drops the
        # rest unparsed (``linger.LingeringTransport``), so the client reads the 400 before a
        # reset.
        self.refusal = reason
        raise h11.RemoteProtocolError(reason, error_status_hint=400)
