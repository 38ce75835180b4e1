"""PEFT ``adapter_config.json`` parsed into a frozen :class:`LoraSpec`, with PEFT's matching rules.

Torch-free (the registry validates uploads with it). Matching follows PEFT exactly, because an
adapter served with a different module set or scale than PEFT would apply is silently wrong:

- ``target_modules`` list: a module matches when its path equals an entry or ends with
  ``"." + entry``; a string is a regex that must ``fullmatch`` the path (``layers_to_transform``
  and ``layers_pattern`` beside it are refused, as PEFT's ``LoraConfig`` refuses them).
- ``rank_pattern`` / ``alpha_pattern``: the first key (in config order) for which
  ``(.*\\.)?(key)$`` matches the module path wins; otherwise ``r`` / ``lora_alpha``.
- scale is ``alpha / r``, or ``alpha / sqrt(r)`` with ``use_rslora``.

The regexes run on RE2, not ``re`` (``config_regex``): the same matches on module paths, in
linear time, because the config comes from tenants.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.config_fields import (
    LAYERS_PATTERN_TEMPLATE,
    PATTERN_KEY_TEMPLATE,
    check_features,
    check_ignored_numbers,
    check_layer_fields,
    expect_bool,
    expect_int,
    expect_number,
    expect_optional_str,
    parse_exclude_modules,
    parse_layers,
    parse_layers_pattern,
    parse_pattern,
    parse_target_modules,
)
from loraplex.artifacts.config_regex import ConfigRegex
from loraplex.errors import AdapterConfigError, UnsupportedAdapterError

CONFIG_FILE = "adapter_config.json"
# adapter_config.json is a few KiB; anything far larger is not a PEFT config.
MAX_CONFIG_BYTES = 1 << 20
# PEFT's defaults for fields an older config may omit.
_DEFAULT_R = 8
_DEFAULT_ALPHA = 8
# PEFT's layer-index rule without layers_pattern (a fixed pattern, so ``re`` is safe here).
_DEFAULT_LAYER_INDEX = re.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")

_T = TypeVar("_T", int, float)


@dataclass(frozen=True)
class LoraSpec:
    """What an adapter applies, where, and at which rank and scale (PEFT semantics)."""

    base_model_name_or_path: str | None  # the base model the adapter was trained on, if recorded
    r: int  # default rank
    lora_alpha: float  # default alpha
    use_rslora: bool  # scale alpha/sqrt(r) instead of alpha/r
    target_modules: tuple[str, ...] | str  # module-name suffixes, or one full-match regex
    rank_pattern: tuple[tuple[str, int], ...]  # (regex key, rank) in config order; first match wins
    alpha_pattern: tuple[tuple[str, float], ...]  # (regex key, alpha) in config order
    layers_to_transform: tuple[int, ...] | None  # restricts list targets to these layers
    layers_pattern: tuple[str, ...] | None  # names of the layer container for layers_to_transform
    exclude_modules: tuple[str, ...] | str | None  # module suffixes or regex never targeted
    task_type: str | None  # PEFT task type (None or CAUSAL_LM)

    def __post_init__(self) -> None:
        if self.r <= 0:
            raise ValueError(f"r {self.r} is invalid; expected an int > 0")
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha {self.lora_alpha} is invalid; expected a number > 0")

    def matcher(self) -> ModuleMatcher:
        """The spec's regexes compiled once, to resolve many modules (validation does)."""
        return ModuleMatcher(self)

    def targets(self, layer: int, module: str) -> bool:
        """Whether PEFT injects a LoRA layer into ``module`` of decoder layer ``layer``."""
        return self.matcher().targets(layer, module)

    def rank_for(self, layer: int, module: str) -> int:
        """Rank of the module's LoRA pair (``rank_pattern`` resolved); meaningful when targeted."""
        return self.matcher().rank_for(layer, module)

    def alpha_for(self, layer: int, module: str) -> float:
        """Alpha of the module (``alpha_pattern`` resolved)."""
        return self.matcher().alpha_for(layer, module)

    def scale_for(self, layer: int, module: str) -> float:
        """The factor PEFT multiplies ``B @ A @ x`` by: alpha/r, or alpha/sqrt(r) with rsLoRA."""
        matcher = self.matcher()
        return self.scale(matcher.rank_for(layer, module), matcher.alpha_for(layer, module))

    def scale(self, rank: int, alpha: float) -> float:
        """PEFT's scaling for a module of ``rank`` and ``alpha``."""
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    def rank_source(self, layer: int, module: str) -> str:
        """The config field the module's rank comes from (for error messages)."""
        return self.matcher().rank_source(layer, module)

    @property
    def max_rank(self) -> int:
        """Upper bound on any module's rank: ``r`` and every ``rank_pattern`` value (as PEFT)."""
        return max([self.r, *(rank for _, rank in self.rank_pattern)])


def read_adapter_config(adapter_dir: Path) -> LoraSpec:
    """Read and parse ``adapter_dir/adapter_config.json``."""
    path = adapter_dir / CONFIG_FILE
    if not path.is_file():
        raise AdapterConfigError("path", str(path), "an existing regular file adapter_config.json")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise AdapterConfigError("size_bytes", size, f"<= {MAX_CONFIG_BYTES}")
    try:
        mapping = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON, or an int
        # of more digits than Python converts (it was a 400 that did not name the file)
        raise AdapterConfigError("json", str(exc), "valid UTF-8 JSON") from exc
    if not isinstance(mapping, dict):
        raise AdapterConfigError("json", type(mapping).__name__, "a JSON object at top level")
    return parse_adapter_config(mapping)


def parse_adapter_config(mapping: Mapping[str, object]) -> LoraSpec:
    """Validate a decoded ``adapter_config.json`` and build its :class:`LoraSpec`.

    Raises UnsupportedAdapterError for PEFT features loraplex does not execute and
    AdapterConfigError for values of the wrong type or range.
    """
    peft_type = mapping.get("peft_type")
    if peft_type != "LORA":
        if isinstance(peft_type, str):
            raise UnsupportedAdapterError("peft_type", peft_type, '"LORA"')
        raise AdapterConfigError("peft_type", peft_type, '"LORA"')
    check_features(mapping)
    check_ignored_numbers(mapping)
    task_type = expect_optional_str(mapping, "task_type")
    if task_type not in (None, "CAUSAL_LM"):
        raise UnsupportedAdapterError("task_type", task_type, 'null or "CAUSAL_LM"')
    r = expect_int(mapping, "r", _DEFAULT_R)
    alpha = expect_number(mapping, "lora_alpha", _DEFAULT_ALPHA)
    spec = LoraSpec(
        base_model_name_or_path=expect_optional_str(mapping, "base_model_name_or_path"),
        r=r,
        lora_alpha=alpha,
        use_rslora=expect_bool(mapping, "use_rslora", default=False),
        target_modules=parse_target_modules(mapping.get("target_modules")),
        rank_pattern=tuple((k, int(v)) for k, v in parse_pattern(mapping, "rank_pattern", True)),
        alpha_pattern=parse_pattern(mapping, "alpha_pattern", False),
        layers_to_transform=parse_layers(mapping.get("layers_to_transform")),
        layers_pattern=parse_layers_pattern(mapping.get("layers_pattern")),
        exclude_modules=parse_exclude_modules(mapping.get("exclude_modules")),
        task_type=task_type,
    )
    check_layer_fields(mapping)  # after each field's own type and size checks
    return spec


class ModuleMatcher:
    """A LoraSpec's regexes compiled once by RE2 (``config_regex``: linear-time matching), so
    resolving every module of a base model compiles nothing again. PEFT's rules, as above."""

    def __init__(self, spec: LoraSpec) -> None:
        self.spec = spec
        targets, exclude = spec.target_modules, spec.exclude_modules
        self._target = ConfigRegex("target_modules", targets) if isinstance(targets, str) else None
        self._names = () if isinstance(targets, str) else targets
        self._exclude = (
            ConfigRegex("exclude_modules", exclude) if isinstance(exclude, str) else None
        )
        self._excluded_names = exclude if isinstance(exclude, tuple) else ()
        self._ranks = _compiled("rank_pattern", spec.rank_pattern)
        self._alphas = _compiled("alpha_pattern", spec.alpha_pattern)
        self._layers = [
            ConfigRegex("layers_pattern", name, LAYERS_PATTERN_TEMPLATE, groups=True)
            for name in spec.layers_pattern or ()
        ]

    def targets(self, layer: int, module: str) -> bool:
        path = BaseModelSpec.module_path(layer, module)
        return not self._excluded(path) and self._selected(path)

    def selects(self, layer: int, module: str) -> bool:
        """Whether ``target_modules`` (with ``layers_to_transform``) selects the module, before
        ``exclude_modules`` takes any out."""
        return self._selected(BaseModelSpec.module_path(layer, module))

    def excluding(self, paths: Iterable[str]) -> set[str]:
        """The ``exclude_modules`` entries (the regex, when it is one) that exclude at least one
        of ``paths``."""
        if self._exclude is not None:
            regex = self._exclude
            return {regex.pattern} if any(regex.fullmatch(path) for path in paths) else set()
        return {name for path in paths for name in self._excluded_names if _names(path, name)}

    def _selected(self, path: str) -> bool:
        if self._target is not None:
            return self._target.fullmatch(path)
        if path in self._names:
            return True
        if not any(path.endswith(f".{name}") for name in self._names):
            return False
        if not self.spec.layers_to_transform:
            return True
        return self._layer_index(path) in self.spec.layers_to_transform

    def rank_for(self, layer: int, module: str) -> int:
        return _first_match(self._ranks, BaseModelSpec.module_path(layer, module), self.spec.r)

    def alpha_for(self, layer: int, module: str) -> float:
        path = BaseModelSpec.module_path(layer, module)
        return _first_match(self._alphas, path, self.spec.lora_alpha)

    def rank_source(self, layer: int, module: str) -> str:
        key = self.rank_key(layer, module)
        return "r" if key is None else f"rank_pattern[{key!r}]"

    def rank_key(self, layer: int, module: str) -> str | None:
        """The ``rank_pattern`` key that decides the module's rank (the first match), if any."""
        return _first_key(self._ranks, BaseModelSpec.module_path(layer, module))

    def alpha_key(self, layer: int, module: str) -> str | None:
        """The ``alpha_pattern`` key that decides the module's alpha, if any."""
        return _first_key(self._alphas, BaseModelSpec.module_path(layer, module))

    def _excluded(self, path: str) -> bool:
        if self._exclude is not None:
            return self._exclude.fullmatch(path)
        return any(_names(path, name) for name in self._excluded_names)

    def _layer_index(self, path: str) -> int | None:
        """The first numbered path segment after a layer container, as PEFT finds it."""
        if not self._layers:
            match = _DEFAULT_LAYER_INDEX.match(path)
            return int(match.group("idx")) if match is not None else None
        for regex in self._layers:
            index = regex.match_group(path, "idx")
            if index is not None:
                return int(index)
        return None


def _names(path: str, name: str) -> bool:
    """A list entry names the module at ``path`` when it is the path or a dotted suffix of it."""
    return path == name or path.endswith(f".{name}")


def _compiled(field: str, pattern: tuple[tuple[str, _T], ...]) -> list[tuple[ConfigRegex, _T]]:
    return [(ConfigRegex(field, key, PATTERN_KEY_TEMPLATE), value) for key, value in pattern]


def _first_match(pattern: list[tuple[ConfigRegex, _T]], path: str, default: _T) -> _T:
    for regex, value in pattern:
        if regex.match(path):
            return value
    return default


def _first_key(pattern: list[tuple[ConfigRegex, _T]], path: str) -> str | None:
    for regex, _ in pattern:
        if regex.match(path):
            return regex.pattern
    return None
