"""What a request body that never became the request's fields gets: an error naming the cause.

FastAPI reports a body sent with a non-JSON ``Content-Type`` as "Input should be a valid
dictionary" (it handed the model the raw bytes), and a body ``json.loads`` refused for a reason
other than syntax (an integer of more digits than Python converts, ``sys.int_max_str_digits``)
as "There was an error parsing the body". Both are the caller's to fix, so both name what to fix:
the header, or the field holding the number.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from email.message import Message

from loraplex.errors import clipped

JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class BodyProblem:
    """Why a body was not read as the request's fields (``server/errors.py`` makes it a 400)."""

    message: str  # safe to show the caller
    param: str | None  # the field (or header) at fault


class _HugeInteger:
    """Stands in for an integer literal too long to convert, so its place can be named."""

    def __init__(self, num_digits: int) -> None:
        self.num_digits = num_digits


def _bounded_int(text: str) -> int | _HugeInteger:
    limit = sys.get_int_max_str_digits()
    digits = len(text.lstrip("-"))
    return _HugeInteger(digits) if limit and digits > limit else int(text)


def _find_huge(parsed: object) -> tuple[str, _HugeInteger] | None:
    """The first stand-in and where it is (``a.b[2]``), depth first; iterative, as the nesting
    is the caller's (up to what ``json`` parses)."""
    pending: list[tuple[str, object]] = [("", parsed)]
    while pending:
        path, value = pending.pop()
        if isinstance(value, _HugeInteger):
            return path, value
        if isinstance(value, dict):
            items = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        pending.extend(reversed(items))
    return None


def huge_integer(body: bytes) -> BodyProblem | None:
    """A 400 naming the field that holds an integer too long to convert; None when ``body``
    fails to parse for another reason (or parses)."""
    try:
        parsed = json.loads(body, parse_int=_bounded_int)
    except (ValueError, RecursionError):
        return None
    found = _find_huge(parsed)
    if found is None:
        return None
    where, number = found
    param = clipped(where) or None  # the keys are the caller's own text
    message = f"{param or 'body'}: an integer of {number.num_digits} digits is out of range"
    return BodyProblem(message, param)


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
