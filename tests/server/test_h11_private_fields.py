"""``h11_bounds.BoundedConnection`` reads h11's private fields (h11 offers no public view of
its receive buffer or its chunked reader's state). Each one it reads is checked here, with the
meaning it relies on, on the installed h11; a version outside ``CHECKED_H11`` fails at once, so
an upgrade cannot silently disable a bound (an ``isinstance`` that stopped matching, or a field
that kept its name and changed its meaning, would skip a check rather than fail)."""

from __future__ import annotations

from importlib.metadata import version

import h11
from h11._readers import ChunkedReader

from loraplex.server.listeners.h11_bounds import CHECKED_H11, BoundedConnection

HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_the_installed_h11_is_one_whose_private_fields_were_checked() -> None:
    installed = version("h11")
    assert installed == h11.__version__
    assert ".".join(installed.split(".")[:2]) in CHECKED_H11, (
        f"h11 {installed}: server/listeners/h11_bounds.py reads h11's private fields, checked "
        f"on {CHECKED_H11}; check each one (this file's tests) and add the version, or keep "
        "the pin in pyproject.toml"
    )


def test_the_private_fields_h11_bounds_reads_mean_what_it_relies_on() -> None:
    conn = BoundedConnection(max_header_bytes=4096, max_body_chunks=8, max_header_count=16)
    assert conn._max_incomplete_event_size == 4096  # the head bound given to h11
    conn.receive_data(HEAD + b"3\r\nabc")
    buffer = conn._receive_buffer._data
    assert isinstance(buffer, bytearray)
    assert bytes(buffer) == HEAD + b"3\r\nabc"  # what was received and not yet parsed
    assert isinstance(conn.next_event(), h11.Request)
    assert bytes(conn._receive_buffer._data) == b"3\r\nabc"  # the head taken off
    reader = conn._reader
    assert type(reader) is ChunkedReader  # the reader of this request's body
    assert (reader._bytes_in_chunk, reader._bytes_to_discard, reader._reading_trailer) == (
        0,
        b"",
        False,
    )  # at a chunk's start
    data = conn.next_event()
    assert isinstance(data, h11.Data) and data.data == b"abc" and data.chunk_start
    # the chunk's data all read: its CRLF still to come, as bytes (the buffer must start so)
    assert (reader._bytes_in_chunk, reader._bytes_to_discard) == (0, b"\r\n")
    conn.receive_data(b"\r\n0\r\nx-t: 1\r\n")  # the last chunk, trailers not yet ended
    assert conn.next_event() is h11.NEED_DATA
    assert reader._reading_trailer  # past the last chunk's line: the trailers are next
    assert bytes(conn._receive_buffer._data) == b"x-t: 1\r\n"
    conn.receive_data(b"\r\n")
    end = conn.next_event()
    assert isinstance(end, h11.EndOfMessage) and list(end.headers) == [(b"x-t", b"1")]


def test_a_chunk_in_progress_counts_its_bytes_left() -> None:
    conn = BoundedConnection(max_header_bytes=4096, max_body_chunks=8, max_header_count=16)
    conn.receive_data(HEAD + b"5\r\nab")
    assert isinstance(conn.next_event(), h11.Request)
    assert isinstance(conn.next_event(), h11.Data)  # "ab", of a 5-byte chunk
    assert conn._reader._bytes_in_chunk == 3
