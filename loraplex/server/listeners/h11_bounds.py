"""h11's server connection bounded where h11 is not: the request head and a chunked body's
trailers (bytes and lines, counted before h11 parses them), and the chunks of a chunked body
(``BoundedConnection``).

NOTE: h11 has no public view of its receive buffer (``trailing_data`` copies all of it) or of
its chunked reader's state, so this reads private fields, of the versions in ``CHECKED_H11``
(pinned in pyproject.toml); ``tests/server/test_h11_private_fields.py`` fails on any other
version, and on a layout that changed, before a bound could silently stop holding.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import h11
from h11._readers import ChunkedReader

from loraplex.server.listeners.unsent import BOTH_FRAMINGS

# h11 minor versions whose private fields were checked (0.14 and 0.15 counted the CRLF after a
# chunk as an int, ``_bytes_to_discard``, not the bytes it must be).
CHECKED_H11 = ("0.16",)
CHUNK_ALLOWANCE_BYTES = 1024  # each KiB of a chunked body allows one more chunk
_BLANK_LINE = re.compile(rb"\n\r?\n")  # the end of a head or of the trailers, as h11 finds it
_LAST_CHUNK = re.compile(rb"0+[ \t]*(;[^\n]*)?\r?\n")  # a chunked body's last chunk line
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]*")  # a chunk size line's size, before its extensions


class BoundedConnection(h11.Connection):
    """h11's server connection, bounded where h11 is not; each refusal a 400 (a 431 for too many
    header lines) and a close:

    - a request head, or the trailer section of a chunked body, longer than
      ``max_incomplete_event_size`` or of more than ``max_header_count`` lines (and a chunk's
      size line longer than ``max_incomplete_event_size``), checked on the
      bytes received before h11 parses any of it: h11 measures only a head still waiting for
      its end, so one that arrived whole in a single read (up to the transport's read size,
      ~100-200 KiB on loopback) passed ``max_header_bytes`` unchecked, and it parses every
      line, with no bound on their number (3,000 tiny headers cost ~30 ms of the event loop per
      request; a read of 256 KiB holds 50,000);
    - a request declaring both ``Transfer-Encoding`` and ``Content-Length``: RFC 9112 §6.3 calls
      it a likely request smuggling attempt, to be handled as an error or answered and the
      connection closed; h11 framed the body by ``Transfer-Encoding`` and kept the connection,
      so a proxy in front that framed it by ``Content-Length`` read the rest of the body as
      another request (one it never authorised) on the same connection;
    - a chunked body's chunk extensions (what follows the size on a chunk's size line) of more
      than ``max_incomplete_event_size`` bytes in all (Node.js's 16 KiB bound, CVE-2024-22019):
      h11 drops them unread, and only each line was bounded, so a body of a few bytes in
      ``max_body_chunks`` chunks carried 64 MiB of extensions past ``max_body_bytes``, all
      received and parsed on the event loop;
    - a chunked body of more than ``max_body_chunks`` chunks plus one per
      ``CHUNK_ALLOWANCE_BYTES`` of body (so a large upload in chunks of 1 KiB or more always
      passes). NOTE: uvicorn appends each chunk to the body received so far (``cycle.body +=
      data``, a copy of all of it), so a body in 1-byte chunks cost time quadratic in the chunks
      of one socket read, on the event loop (about a second per read of a 2 MB body sent that
      way, 12 MB on the wire).

    ``refusal`` says which, for the answer's text (uvicorn's own is "Invalid HTTP request"), and
    ``refusal_status`` its status."""

    def __init__(self, max_header_bytes: int, max_body_chunks: int, max_header_count: int) -> None:
        super().__init__(h11.SERVER, max_header_bytes)
        self._max_body_chunks = max_body_chunks
        self._max_header_count = max_header_count
        self._num_chunks = 0  # chunks of the current request's body so far
        self._num_body_bytes = 0  # and their bytes
        self._num_extension_bytes = 0  # and the bytes of their chunk extensions
        # (chunks, bytes) when the last size line was counted: each line is counted once
        self._counted_line: tuple[int, int] | None = None
        self._searched = 0  # bytes of the buffer already searched for the head's end
        self.refusal: str | None = None  # why this connection's request was refused
        self.refusal_status = 400  # the status that refusal is answered with
        # the setting whose bound refused it (``BOTH_FRAMINGS``: a request framed twice); None:
        # no refusal of this class (h11's own, uvicorn's text and status)
        self.refusal_setting: str | None = None

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:
            self._check_lines("request head", 0, 1)
        elif self.their_state is h11.SEND_BODY and isinstance(self._reader, ChunkedReader):
            self._check_chunk_framing(self._reader)
        event = super().next_event()
        if event is not h11.NEED_DATA:
            self._searched = 0  # the buffer's start was taken
        if isinstance(event, h11.Request):
            self._num_chunks = self._num_body_bytes = self._num_extension_bytes = 0
            self._counted_line = None
            self._check_framing(event)
        elif isinstance(event, h11.Data):
            self._num_body_bytes += len(event.data)
            self._num_chunks += event.chunk_start
            allowed = self._max_body_chunks + self._num_body_bytes // CHUNK_ALLOWANCE_BYTES
            if self._num_chunks > allowed and self.our_state is h11.SEND_RESPONSE:
                self._refuse(
                    f"request body in more than max_body_chunks {self._max_body_chunks} chunks "
                    f"plus one per {CHUNK_ALLOWANCE_BYTES} bytes; send larger chunks or a "
                    "Content-Length body",
                    "max_body_chunks",
                )
        return event

    def _check_chunk_framing(self, reader: ChunkedReader) -> None:
        """At a chunk's start, its size line at most ``max_header_bytes`` and, after the last
        chunk, the trailers as a head. NOTE: h11 parses the trailers in the same call as the
        last chunk's line, and keeps where its reader is in private fields (``CHECKED_H11``)."""
        if reader._reading_trailer:
            self._check_lines("trailer section", 0, 0)
            return
        data = self._receive_buffer._data
        start = len(reader._bytes_to_discard)  # the CRLF ending the chunk before
        if reader._bytes_in_chunk or not data.startswith(reader._bytes_to_discard):
            return  # inside a chunk's data, or its CRLF not all here (or wrong: h11 refuses)
        max_bytes = self._max_incomplete_event_size
        line_end = data.find(b"\n", start, start + max_bytes + 1)
        if line_end < 0:
            if len(data) - start > max_bytes:
                self._refuse(
                    f"chunk size line of more than {max_bytes} bytes exceeds max_header_bytes",
                    "max_header_bytes",
                )
            return
        self._count_extensions(data, start, line_end)
        if _LAST_CHUNK.match(data, start, line_end + 1):
            self._check_lines("trailer section", line_end + 1, 0)

    def _check_framing(self, request: h11.Request) -> None:
        """Refuses a request framed twice (the class docstring); h11 lowercases the names."""
        names = {name for name, _ in request.headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            self._refuse(
                "request with both Transfer-Encoding and Content-Length (RFC 9112 section 6.3: "
                "a request smuggling attempt); send one of them",
                BOTH_FRAMINGS,
            )

    def _count_extensions(self, data: bytearray, start: int, line_end: int) -> None:
        """Adds the chunk extensions of the size line ``data[start:line_end]`` (whole, h11
        parses it next) to the body's, once; past ``max_incomplete_event_size`` a 400."""
        line = (self._num_chunks, self._num_body_bytes)  # the same until h11 takes the line
        if line == self._counted_line:
            return
        self._counted_line = line
        size = _CHUNK_SIZE.match(data, start, line_end)
        size_end = start if size is None else size.end()
        ext_end = line_end - 1 if data[line_end - 1 : line_end] == b"\r" else line_end
        self._num_extension_bytes += max(0, ext_end - size_end)
        max_bytes = self._max_incomplete_event_size
        if self._num_extension_bytes > max_bytes:
            self._refuse(
                f"chunk extensions of more than {max_bytes} bytes in one request body exceed "
                "max_header_bytes",
                "max_header_bytes",
            )

    def _check_lines(self, what: str, start: int, num_leading: int) -> None:
        """Refuses a head (``num_leading`` 1: the request line) or trailer section, from
        ``start`` in the buffer, whose bytes received so far show it longer than
        ``max_header_bytes``, or, once its end is here, of more than ``max_header_count`` header
        lines, before h11 parses it. Each byte is searched for the end once (a head sent a byte
        at a time is not searched again and again)."""
        data = self._receive_buffer._data  # NOTE: h11's bytearray; read here, never changed
        if num_leading == 0 and data.startswith((b"\r", b"\n"), start):
            return  # no trailers: what follows the blank line is the next request's
        max_bytes = self._max_incomplete_event_size
        end = _BLANK_LINE.search(data, max(start, self._searched - 2), start + max_bytes + 3)
        self._searched = len(data)
        if end is None:
            if len(data) - start > max_bytes:
                self._refuse(
                    f"{what} of more than {max_bytes} bytes exceeds max_header_bytes",
                    "max_header_bytes",
                )
            return
        if end.end() - start > max_bytes:
            self._refuse(
                f"{what} of {end.end() - start} bytes exceeds max_header_bytes {max_bytes}",
                "max_header_bytes",
            )
        num_lines = data.count(b"\n", start, end.start() + 1) - num_leading
        if num_lines > self._max_header_count:
            self._refuse(
                f"{what} of {num_lines} header lines exceeds max_header_count "
                f"{self._max_header_count}",
                "max_header_count",
                status=431,
            )

    def _refuse(self, reason: str, setting: str, status: int = 400) -> NoReturn:
        # NOTE: the client's state stays as it was: mid-body, the close lingers and drops the
        # rest unparsed (``linger.LingeringTransport``), so the client reads the answer before
        # a reset.
        self.refusal = reason
        self.refusal_status = status
        self.refusal_setting = setting
        raise h11.RemoteProtocolError(reason, error_status_hint=status)
