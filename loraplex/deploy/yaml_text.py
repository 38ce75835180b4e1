"""Block-style YAML for manifests, without a YAML library.

Why not PyYAML: it is not a loraplex dependency, and manifests need only maps, lists, strings,
integers and booleans. Every string is double-quoted (a JSON string is a valid YAML
double-quoted scalar), so no value is ever read back as another type ("8000", "yes", "null");
multi-line strings (embedded config files) are literal blocks, readable with ``kubectl get -o
yaml``. Only printable ASCII is written, which keeps both forms exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TypeGuard

Yaml = Mapping[str, "Yaml"] | Sequence["Yaml"] | str | int | bool
_PLAIN_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-/]*$")
# Words YAML 1.1 readers (PyYAML, older Go libraries) take for booleans or null.
_RESERVED_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}
_PRINTABLE = re.compile(r"^[\n\x20-\x7e]*$")


def dump_documents(documents: Sequence[Mapping[str, Yaml]], comment: Sequence[str] = ()) -> str:
    """A YAML stream: ``comment`` lines as ``#`` comments, then each document after ``---``."""
    lines = [f"# {line}".rstrip() for line in comment]
    for document in documents:
        lines.append("---")
        lines += _mapping(document, 0)
    return "\n".join(lines) + "\n"


def _mapping(value: Mapping[str, Yaml], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for key, item in value.items():
        head = f"{pad}{_key(key)}:"
        if isinstance(item, Mapping) and item:
            lines += [head, *_mapping(item, indent + 2)]
        elif _is_list(item) and item:
            lines += [head, *_sequence(item, indent + 2)]
        elif isinstance(item, str) and _literal_ok(item):
            lines += [f"{head} |", *_literal(item, indent + 2)]
        else:
            lines.append(f"{head} {_scalar(item)}")
    return lines


def _sequence(value: Sequence[Yaml], indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for item in value:
        if isinstance(item, Mapping) and item:
            nested = _mapping(item, indent + 2)
            lines += [f"{pad}- {nested[0].lstrip()}", *nested[1:]]
        elif _is_list(item) and item:
            raise TypeError("a list directly inside a list is not written")
        else:
            lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _is_list(value: object) -> TypeGuard[Sequence[Yaml]]:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _key(key: str) -> str:
    plain = _PLAIN_KEY.fullmatch(key) and key.lower() not in _RESERVED_WORDS
    return key if plain else _quoted(key)


def _scalar(value: Yaml) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, Mapping):
        return "{}"
    return "[]"


def _quoted(text: str) -> str:
    if not _PRINTABLE.fullmatch(text):
        raise ValueError(f"{text[:64]!r} is not printable ASCII; manifests carry only ASCII")
    return json.dumps(text)


def _literal_ok(text: str) -> bool:
    """A literal block keeps ``text`` exactly when it ends in one newline, its first non-empty
    line does not start with a space (that would need an indentation indicator) and it is
    printable ASCII."""
    return (
        "\n" in text.rstrip("\n")
        and text.endswith("\n")
        and not text.endswith("\n\n")
        and not text.lstrip("\n").startswith(" ")
        and _PRINTABLE.fullmatch(text) is not None
    )


def _literal(text: str, indent: int) -> list[str]:
    pad = " " * indent
    return [f"{pad}{line}" if line else "" for line in text[:-1].split("\n")]
