"""Regexes from ``adapter_config.json``, matched by RE2 (``google-re2``), never by ``re``.

Tenants write these patterns and PEFT runs them with Python's backtracking ``re``, where a
pattern like ``([\\w.]+)+x`` takes time exponential in the module path's length inside one C call
that holds the GIL, so every thread of the process, the engine's included, stops. RE2 matches in
time linear in the path and refuses what needs backtracking (backreferences, lookarounds, atomic
groups, possessive quantifiers). A pattern is accepted only if Python's ``re`` compiles it (PEFT
must be able to load the adapter) and its RE2 program has at most MAX_PROGRAM_SIZE instructions;
``_config_fields`` bounds a whole field by MAX_FIELD_PROGRAM_SIZE and MAX_CONFIG_ENTRIES, so
resolving every module of the base model is a bounded number of bounded matches.

For what PEFT configs use (literals, ``.``, classes, ``\\d``/``\\w``, alternation, groups,
quantifiers, ``^``/``$``) RE2 and ``re`` accept the same ASCII module paths (tested against
``re``). NOTE: Python's ``\\Z`` is not RE2 syntax, so a pattern using it is refused; ``$`` means
the same on module paths.
"""

from __future__ import annotations

import re
from collections.abc import Sized
from typing import Any

import re2

from loraplex.errors import AdapterConfigError

# A pattern longer than this is not a module selector; refused before it is compiled.
MAX_PATTERN_CHARS = 1024
# RE2 instructions of one compiled pattern (".*\.(q|v)_proj" needs ~30, ".{0,1000}" ~9000).
MAX_PROGRAM_SIZE = 4096
# RE2 instructions of all patterns of one config field together (rank_pattern keys, ...): a
# key per module of a 126-layer model (~74 each) fits. Bounds the field's matching work, since
# a pattern's cost per module path grows with its program.
MAX_FIELD_PROGRAM_SIZE = 1 << 16
# Entries in one list or map field (target_modules, rank_pattern, layers_to_transform, ...):
# one per module of a 126-layer model still fits.
MAX_CONFIG_ENTRIES = 1024
# RE2's memory for one pattern's program and match cache (its default is 8 MiB).
_MAX_MEM_BYTES = 1 << 20


class ConfigRegex:
    """One config pattern, compiled by RE2 as PEFT embeds it (``template`` with ``{}``).

    Without ``groups`` nothing is captured (a match is only a yes or no), which lets RE2 answer
    from its DFA; ``match_group`` needs ``groups=True``.
    """

    def __init__(
        self, field: str, pattern: object, template: str = "{}", *, groups: bool = False
    ) -> None:
        if not isinstance(pattern, str):
            raise AdapterConfigError(field, pattern, "a regular expression string")
        if len(pattern) > MAX_PATTERN_CHARS:
            raise AdapterConfigError(
                field,
                pattern,
                f"a regular expression of at most {MAX_PATTERN_CHARS} characters "
                f"(it has {len(pattern)})",
            )
        full = template.replace("{}", pattern)
        try:
            re.compile(full)
        except re.error as exc:
            raise AdapterConfigError(field, pattern, f"a valid regular expression ({exc})") from exc
        options = re2.Options()
        options.log_errors = False
        options.max_mem = _MAX_MEM_BYTES
        options.never_capture = not groups
        try:
            self._regexp: Any = re2.compile(full, options)
        except re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            raise AdapterConfigError(
                field,
                pattern,
                f"a valid regular expression that RE2 can match in linear time ({reason}; "
                "backreferences, lookarounds, atomic groups, possessive quantifiers and \\Z "
                "are not supported)",
            ) from exc
        self.field = field  # the config field it came from
        self.pattern = pattern  # as written in the config
        self.program_size: int = self._regexp.programsize  # RE2 instructions
        if self.program_size > MAX_PROGRAM_SIZE:
            raise AdapterConfigError(
                field,
                pattern,
                f"a regular expression of at most {MAX_PROGRAM_SIZE} RE2 instructions "
                f"(it compiles to {self.program_size}; large counted repetitions blow it up)",
            )

    def fullmatch(self, text: str) -> bool:
        """Like ``re.fullmatch(pattern, text) is not None``."""
        return self._regexp.fullmatch(text) is not None

    def match(self, text: str) -> bool:
        """Like ``re.match(pattern, text) is not None`` (anchored at the start only)."""
        return self._regexp.match(text) is not None

    def match_group(self, text: str, group: str) -> str | None:
        """The named ``group`` of ``re.match(pattern, text)``, or None when it does not match."""
        found = self._regexp.match(text)
        value = None if found is None else found.group(group)
        return None if value is None else str(value)


def check_field_budget(field: str, patterns: list[ConfigRegex]) -> None:
    """All patterns of one field together stay within MAX_FIELD_PROGRAM_SIZE instructions."""
    total = sum(p.program_size for p in patterns)
    if total > MAX_FIELD_PROGRAM_SIZE:
        raise AdapterConfigError(
            field,
            f"{len(patterns)} patterns of {total} RE2 instructions in all",
            f"at most {MAX_FIELD_PROGRAM_SIZE} RE2 instructions over the field's patterns",
        )


def check_entry_count(field: str, value: Sized) -> None:
    """A list or map field holds at most MAX_CONFIG_ENTRIES entries."""
    if len(value) > MAX_CONFIG_ENTRIES:
        raise AdapterConfigError(
            field, value, f"at most {MAX_CONFIG_ENTRIES} entries (it has {len(value)})"
        )
