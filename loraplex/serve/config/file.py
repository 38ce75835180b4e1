"""``loraplex serve``'s TOML file (its ``[serve]`` table, keys named as the flags) and the merge of
flags over it over the defaults into a ``ServeConfig``."""

from __future__ import annotations

import tomllib
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from loraplex.errors import did_you_mean
from loraplex.serve.config.keys import FILE_KEYS, file_key
from loraplex.serve.config.record import ServeConfig
from loraplex.serve.config.vllm import vllm_file_keys

_PATH_FIELDS = {"data_dir", "model", "import_dir", "request_log_path"}
_DEPRECATED_KEYS = {"torch_threads": "threads"}  # still read, with a warning naming the new key
_TOML_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def read_config_file(path: Path, other_tables: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``[serve]`` table of a TOML file (or its top level when there is no such table, less
    ``other_tables``: the tables another reader takes, e.g. ``loraplex fleet``'s ``[fleet]``),
    as ServeConfig field names. Keys are the flag names; a value of the wrong TOML type is
    refused naming the key (it would otherwise fail later, in a comparison, without a name)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config file {path}: {exc}") from exc
    if "serve" in document:
        table = document["serve"]
        # NOTE: top-level keys beside a [serve] table were read by nothing, in silence: a
        # `port = 9000` above `[serve]` left the server on 8000
        outside = sorted(set(document) - {"serve", *other_tables})
        if outside:
            raise ValueError(
                f"config file {path}: keys {outside} are outside the [serve] table, where "
                "nothing reads them; expected them inside it (a file holds a [serve] table or "
                "top-level keys, not both)"
            )
    else:
        table = {k: v for k, v in document.items() if k not in other_tables}
    if not isinstance(table, dict):
        raise ValueError(f"config file {path}: [serve] is invalid; expected a table")
    table = _field_names(path, table)
    hints = typing.get_type_hints(ServeConfig)
    for key, value in table.items():
        _check_type(path, file_key(key), value, hints[key])
    base = path.parent
    return {
        k: (base / v if k in _PATH_FIELDS and isinstance(v, str) else v) for k, v in table.items()
    }


def file_keys() -> frozenset[str]:
    """The keys a config file's ``[serve]`` table takes (deprecated names aside)."""
    names = {f.name for f in fields(ServeConfig)} - set(FILE_KEYS.values())
    return frozenset(names | set(FILE_KEYS))


def _field_names(path: Path, table: dict[str, Any]) -> dict[str, Any]:
    """``table`` keyed by field name; unknown keys refused, deprecated ones warned about."""
    keys = file_keys()
    unknown = sorted(set(table) - keys - set(_DEPRECATED_KEYS))
    if unknown:
        vllm = vllm_file_keys(unknown)  # NOTE: enable_lora was "did you mean max_loras?"
        hint = did_you_mean([k for k in unknown if k not in vllm], keys)
        hint += "".join(
            f" ({k}: vLLM's --{k.replace('_', '-')}, which loraplex serve does not take; "
            "docs/migrating-from-vllm.md says what to use instead)"
            for k in vllm
        )
        raise ValueError(
            f"config file {path}: unknown keys {unknown}{hint}; expected {sorted(keys)}"
        )
    renamed: dict[str, Any] = {}
    for key, value in table.items():
        if key in _DEPRECATED_KEYS:
            new_key = _DEPRECATED_KEYS[key]
            if new_key in table:
                raise ValueError(
                    f"config file {path}: {key} and {new_key} are both set; expected {new_key} "
                    f"only ({key} is its deprecated name)"
                )
            warnings.warn(
                f"config file {path}: key {key} is deprecated; use {new_key}",
                FutureWarning,
                stacklevel=3,
            )
            renamed[FILE_KEYS.get(new_key, new_key)] = value
        else:
            renamed[FILE_KEYS.get(key, key)] = value
    return renamed


def _check_type(path: Path, key: str, value: object, hint: object) -> None:
    """ValueError naming ``key`` unless ``value`` (as TOML parsed it) fits the field's type."""
    members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    accepted = {str if m is Path else m for m in members if m is not type(None)}
    if float in accepted:
        accepted.add(int)  # TOML writes a whole number of seconds without a point
    # NOTE: bool is an int subclass; TOML's true is not a count.
    if type(value) not in accepted:
        names = [
            name
            for kind, name in _TOML_TYPE_NAMES.items()
            if kind in accepted and not (kind is int and float in accepted)
        ]
        expected = " or ".join(names)
        raise ValueError(
            f"config file {path}: {key} = {value!r:.60} is invalid; expected {expected}"
        )


class SettingsRefused(ValueError):
    """``ServeConfig``'s refusal of merged values, with what it is owed to: ``flags``, the fields
    of the fewest given flags without which the values pass (empty: the file's values fail
    without any flag). The CLI names those flags, or the file, from it (``keys.flag_name``)."""

    def __init__(self, message: str, flags: tuple[str, ...]) -> None:
        super().__init__(message)
        self.flags = flags


Check = Callable[[ServeConfig], object]
T = TypeVar("T")
Build = Callable[[Mapping[str, Any]], T]  # the settings from the flags given


def merge(
    file_values: Mapping[str, Any], flags: Mapping[str, Any], check: Check = lambda _: None
) -> ServeConfig:
    """Flags given on the command line (not None) override the file; the file the defaults.
    ``check`` (e.g. ``cli.serve.check_before_keys``) runs on the result. A refusal, by
    ``ServeConfig`` or ``check``, is a ``SettingsRefused`` naming the flags it is owed to."""
    given = {k: v for k, v in flags.items() if v is not None}
    return settled(lambda flags_given: _config(file_values, flags_given, check), given)


def settled(build: Build[T], given: Mapping[str, Any]) -> T:
    """``build(given)``, where ``given`` are the flags typed (by field name) and ``build`` reads
    the rest (a file, the defaults) itself: its ``ValueError`` is a ``SettingsRefused`` naming
    the given flags it is owed to (``loraplex fleet up``'s own flags are settled so too)."""
    try:
        return build(given)
    except ValueError as exc:
        raise SettingsRefused(str(exc), _owed_to(build, given)) from exc


def _config(file_values: Mapping[str, Any], given: Mapping[str, Any], check: Check) -> ServeConfig:
    values = {**file_values, **given}
    for name in _PATH_FIELDS:
        if isinstance(values.get(name), str):
            values[name] = Path(values[name])
    config = ServeConfig(**values)
    check(config)
    return config


def _owed_to(build: Build[object], given: Mapping[str, Any]) -> tuple[str, ...]:
    """The given flags a refusal is owed to: each flag is dropped in turn while the rest are
    still refused, which leaves the fewest needed (both of a pair refused only together, none
    when the file alone is refused). Decided by refusal, never by the message's text."""
    owed = dict(given)
    for name in given:
        rest = {k: v for k, v in owed.items() if k != name}
        if _refused(build, rest):
            owed = rest
    return tuple(owed)


def _refused(build: Build[object], given: Mapping[str, Any]) -> bool:
    try:
        build(given)
    except ValueError:
        return True
    return False
