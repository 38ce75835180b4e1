"""Adapter uploads parsed while they stream in (``POST /admin/adapters/upload``).

Starlette's form parser spools every file part to a temporary file before the route runs, and
the route then copied it into its staging directory: a 100 MB upload cost 200 MB of disk writes
(and the other tenants' cold loads waited behind the write-back) whatever it held. Here each
file part goes straight into its staging file, written off the event loop, once; the weights
part's safetensors length prefix is checked as soon as its first 8 bytes arrive, so a header
over the cap is refused before the rest of the file is read. Only the known parts are accepted
(a 400 names any other, or a repeated one); text fields are bounded; the total is bounded by
``max_upload_bytes`` while it streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.safetensors_header import LENGTH_PREFIX_BYTES, check_length_prefix
from loraplex.artifacts.signature import MAX_SIGNATURE_BYTES, SIGNATURE_FILE
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.errors import LoraplexError, clipped, quoted
from loraplex.server.errors import ErrorContext, invalid_request, to_api_error
from loraplex.server.limits import upload_too_large

FILE_PARTS = {"config": CONFIG_FILE, "weights": WEIGHTS_FILE}  # form name -> staged file name
# Optional file parts: the model-signing bundle, staged as model.sig beside the two files.
OPTIONAL_FILE_PARTS = {"signature": SIGNATURE_FILE}
TEXT_PARTS = frozenset(
    {
        "tenant",
        "name",
        "revision",
        "state",
        "warm_policy",
        "visibility",
        "probe_prompt",
        "expected_continuation",
    }
)
MAX_TEXT_PART_BYTES = 64 << 10  # one text field (a probe prompt is the longest)
_MAX_PART_HEADER_BYTES = 4096  # one part's header line (name and value)


@contextmanager
def staging_hidden(staging: Path, shown: str) -> Iterator[None]:
    """Errors raised in the block say ``shown`` where they named ``staging``: validation names
    the file it read, and a server's temporary directory means nothing to the caller (and tells
    them about the server's file system)."""
    try:
        yield
    except LoraplexError as exc:
        error = to_api_error(exc, ErrorContext.ADMIN)
        message = error.message.replace(str(staging), clipped(shown))
        raise replace(error, message=message) from None


class _UploadParts:
    """MultipartParser callbacks: file parts into ``staging``, text parts into ``texts``."""

    def __init__(self, staging: Path, max_bytes: int) -> None:
        self.staging = staging
        self.max_bytes = max_bytes
        self.texts: dict[str, bytearray] = {}
        self.files: set[str] = set()
        self._num_bytes = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._part: str | None = None  # the form name of the part being read
        self._out: BinaryIO | None = None  # its staging file (file parts)
        self._prefix = bytearray()  # the weights part's first bytes, until checked
        self._part_bytes = 0  # bytes of the file part being read

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_part_end": self._end,
        }

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def _begin(self) -> None:
        self._disposition = b""
        self._part = None

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]
        self._check_header()

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]
        self._check_header()

    def _check_header(self) -> None:
        if len(self._header_name) + len(self._header_value) > _MAX_PART_HEADER_BYTES:
            raise invalid_request(f"an upload part header exceeds {_MAX_PART_HEADER_BYTES} bytes")

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._disposition)
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if name in self.files or name in self.texts:
            raise invalid_request(f"upload part {quoted(name)} is repeated", name)
        if name in FILE_PARTS or name in OPTIONAL_FILE_PARTS:
            self.files.add(name)
            staged = {**FILE_PARTS, **OPTIONAL_FILE_PARTS}[name]
            self._out = (self.staging / staged).open("xb")
            self._prefix.clear()
            self._part_bytes = 0
        elif name in TEXT_PARTS:
            self.texts[name] = bytearray()
        else:
            expected = ", ".join(
                sorted(FILE_PARTS.keys() | OPTIONAL_FILE_PARTS.keys() | TEXT_PARTS)
            )
            raise invalid_request(f"upload part {quoted(name)} is unknown; expected {expected}")
        self._part = name

    def _data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        self._num_bytes += len(chunk)
        if self._num_bytes > self.max_bytes:
            raise upload_too_large(self.max_bytes)
        if self._out is not None:
            self._part_bytes += len(chunk)
            if self._part == "signature" and self._part_bytes > MAX_SIGNATURE_BYTES:
                raise invalid_request(
                    f"upload part 'signature' exceeds {MAX_SIGNATURE_BYTES} bytes", "signature"
                )
            if self._part == "weights" and len(self._prefix) < LENGTH_PREFIX_BYTES:
                self._prefix += chunk[: LENGTH_PREFIX_BYTES - len(self._prefix)]
                if len(self._prefix) == LENGTH_PREFIX_BYTES:
                    check_length_prefix(bytes(self._prefix), "upload part 'weights'")
            self._out.write(chunk)
        elif self._part is not None:
            text = self.texts[self._part]
            text += chunk
            if len(text) > MAX_TEXT_PART_BYTES:
                raise invalid_request(
                    f"upload field {self._part!r} exceeds {MAX_TEXT_PART_BYTES} bytes", self._part
                )

    def _end(self) -> None:
        self.close()
        self._part = None


async def receive_upload(request: Request, staging: Path, max_bytes: int) -> dict[str, str]:
    """Streams a multipart/form-data upload into ``staging`` (``adapter_config.json``,
    ``adapter_model.safetensors`` and, when given, the ``model.sig`` bundle); returns its text
    fields. 400 for a malformed or incomplete upload, 413 past ``max_bytes``, 422 for a weights
    header over the cap."""
    media_type, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if media_type != b"multipart/form-data" or not boundary:
        raise invalid_request("an upload is multipart/form-data with a boundary")
    parts = _UploadParts(staging, max_bytes)
    parser = MultipartParser(boundary, parts.callbacks())  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            if chunk:  # file writes happen in the callbacks: off the event loop
                await run_in_threadpool(parser.write, chunk)
        await run_in_threadpool(parser.finalize)
    except MultipartParseError as exc:
        raise invalid_request(f"malformed upload: {type(exc).__name__}") from None
    finally:
        parts.close()
    missing = sorted(FILE_PARTS.keys() - parts.files)
    if missing:
        raise invalid_request(f"upload lacks the part(s) {', '.join(missing)}", missing[0])
    try:
        return {name: bytes(value).decode("utf-8") for name, value in parts.texts.items()}
    except UnicodeDecodeError:
        raise invalid_request("upload fields must be UTF-8 text") from None
