"""What a request body that never became the request's fields gets: an error naming the cause.

FastAPI reports a body sent with a non-JSON ``Content-Type`` as "Input should be a valid
dictionary" (it handed the model the raw bytes), and a body ``json.loads`` refused for a reason
other than syntax (an integer of more digits than Python converts, ``sys.int_max_str_digits``)
as "There was an error parsing the body". Both are the caller's to fix, so both name what to fix:
the header, or the field holding the number.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from itertools import compress, repeat

from fastapi.exceptions import RequestValidationError

from loraplex.errors import clipped, quoted

JSON_CONTENT_TYPE = "application/json"


class DuplicateKeyError(ValueError):
    """A JSON object of the body holds ``key`` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {quoted(key)} is given twice in one object; expected once")
        self.key = key


class InvalidBody(ValueError):
    """A large body that its route's model refused, validated off the event loop
    (``json_route.py``): FastAPI makes it the cause of a 400, which ``errors.py`` words as the
    validation error it carries."""

    def __init__(self, error: RequestValidationError) -> None:
        super().__init__("the body does not match the route's model")
        self.error = error


@dataclass(frozen=True)
class BodyProblem:
    """Why a body was not read as the request's fields (``server/errors.py`` makes it a 400)."""

    message: str  # safe to show the caller
    param: str | None  # the field (or header) at fault


# What stands in for an integer literal too long to convert (its digits follow the colon), so its
# place can be named: a JSON string no client sends (it starts with NUL).
_MARK = "\x00loraplex-huge-integer:"


def _marked(match: re.Match[bytes]) -> bytes:
    return b'"\\u0000loraplex-huge-integer:%d"' % len(match.group().lstrip(b"-"))


def _bounded_int(text: str) -> int | str:
    digits = len(text.lstrip("-"))
    return f"{_MARK}{digits}" if digits > sys.get_int_max_str_digits() else int(text)


def _find_huge(parsed: object) -> tuple[str, int] | None:
    """The first stand-in and where it is (``a.b[2]``), depth first, with its digits; iterative,
    as the nesting is the caller's (up to what ``json`` parses). A path is built only for the
    objects and lists on the way, not for every number of a long list."""
    pending: list[tuple[str, object]] = [("", parsed)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, str):
            if value.startswith(_MARK):
                return path, int(value[len(_MARK) :])
            continue
        if isinstance(value, dict):
            items = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{path}[{i}]", value[i]) for i in _nested_items(value)]
        else:
            continue
        pending.extend(reversed(items))
    return None


_NESTED = (dict, list, str)  # what a list item must be to hold a stand-in
_SCAN_SLICE = 1 << 16  # list items checked per C call (between them other threads may run)


def _nested_items(values: list[object]) -> Iterator[int]:
    """Indices of the items of ``values`` that may hold a stand-in. NOTE: picked in C, a slice
    at a time (a comprehension took ~1 s on the 1.5 million numbers of a 3 MiB body on the
    shared cores; one C call over all of them held the GIL throughout)."""
    for start in range(0, len(values), _SCAN_SLICE):
        part = values[start : start + _SCAN_SLICE]
        picked = compress(range(start, start + len(part)), map(isinstance, part, repeat(_NESTED)))
        yield from list(picked)


def huge_integer(body: bytes) -> BodyProblem | None:
    """A 400 naming the field that holds an integer too long to convert; None when ``body``
    fails to parse for another reason (or parses).

    NOTE: each such integer is found by a scan of the text and replaced by a stand-in, and the
    body parsed once by ``json``'s own parser: parsed with a ``parse_int`` hook, a call of
    Python code per integer, 3 MiB of small integers and one long one cost seconds, on the event
    loop, for each 400 (docs/benchmarks/attack13.md). A digit run that long inside a string
    breaks the stand-in's quotes: then the hook it is (run by ``errors.py`` on the thread pool,
    and the hook's Python code lets the event loop take the GIL)."""
    limit = sys.get_int_max_str_digits()
    if not limit:
        return None
    marked, num_runs = re.subn(rb"-?[0-9]{%d,}" % (limit + 1), _marked, body)
    if not num_runs:
        return None
    try:
        parsed = json.loads(marked)
    except (ValueError, RecursionError):  # a digit run inside a string broke the stand-in
        try:
            parsed = json.loads(body, parse_int=_bounded_int)
        except (ValueError, RecursionError):
            return None
    found = _find_huge(parsed)
    if found is None:
        return None
    where, num_digits = found
    param = clipped(where) or None  # the keys are the caller's own text
    message = f"{param or 'body'}: an integer of {num_digits} digits is out of range"
    return BodyProblem(message, param)


def too_deep() -> BodyProblem:
    """The problem of a body nested deeper than ``json`` parses (it raised ``RecursionError``).
    NOTE: FastAPI answered it "There was an error parsing the body", naming nothing (32,749
    levels of ``[``, docs/benchmarks/attack15.md); the parser's limit is Python's recursion
    limit less the stack already in use, so the number given is approximate."""
    message = (
        "body: JSON nested too deeply to parse; nest lists and objects less than about "
        f"{sys.getrecursionlimit()} levels deep"
    )
    return BodyProblem(message, None)


class EncodedBody(ValueError):
    """A body declared encoded (``Content-Encoding``), refused before it is read, or one not in
    UTF-8, refused before it is parsed (``json_route.py``)."""

    def __init__(self, problem: BodyProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def unsupported_content_encoding(declared: str | None) -> BodyProblem | None:
    """A problem naming ``Content-Encoding`` when the request declared its body encoded (gzip,
    br, ...); None without one or with ``identity``. NOTE: the header was ignored: a plain body
    declared ``br`` was served as if undeclared, and a gzip body got "There was an error parsing
    the body", naming nothing (docs/benchmarks/attack15.md)."""
    if declared is None or all(
        coding.strip().lower() in ("", "identity") for coding in declared.split(",")
    ):
        return None
    message = (
        f"Content-Encoding {clipped(declared.strip())!r} is not supported; send the body "
        "unencoded (identity)"
    )
    return BodyProblem(message, "Content-Encoding")


# The encodings ``json.loads`` reads bytes in that JSON allows between systems (RFC 8259 §8.1:
# UTF-8; a leading byte order mark may be ignored, as Python's parser does).
_UTF8 = ("utf-8", "utf-8-sig")


def not_utf8(content_type: str | None, body: bytes) -> BodyProblem | None:
    """A problem naming ``Content-Type`` for a body that is not UTF-8 JSON: one in UTF-16 or
    UTF-32 (as ``json.loads`` detects them), or one declared in another ``charset``; None for
    UTF-8. NOTE: ``json.loads`` read UTF-16 and UTF-32 bodies, and FastAPI ignored the charset:
    a gateway in front that reads the body as JSON (RFC 8259: UTF-8) to check ``model`` or
    ``max_tokens`` found no JSON in a UTF-16 body, or another text than the one served when told
    ``charset=utf-16`` of a UTF-8 one, while the server ran the request."""
    charset = None
    if content_type:
        header = Message()
        header["content-type"] = content_type
        charset = header.get_content_charset()
    if charset is not None and charset.replace("-", "").replace("_", "") != "utf8":
        found = f"declared charset {clipped(charset)!r}"
    elif (encoding := json.detect_encoding(body)) not in _UTF8:
        found = f"a body in {encoding}"
    else:
        return None
    message = f"{found} is not supported; send the JSON body in UTF-8 (RFC 8259)"
    return BodyProblem(message, "Content-Type")


def unsupported_content_type(declared: str | None) -> BodyProblem | None:
    """A problem naming ``Content-Type`` when the request declared a type that is not JSON
    (FastAPI then never parsed the body); None for JSON or no declared type (parsed as JSON)."""
    if not declared:
        return None
    header = Message()
    header["content-type"] = declared
    subtype = header.get_content_subtype()
    if header.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    ):
        return None
    message = (
        f"Content-Type {clipped(header.get_content_type())!r} is not supported; send the "
        f"body as JSON with Content-Type: {JSON_CONTENT_TYPE}"
    )
    return BodyProblem(message, "Content-Type")
