"""Field-level checks for ``adapter_config.json`` (used by :mod:`loraplex.artifacts.manifest`).

Every PEFT ``LoraConfig`` key is in exactly one of three groups: parsed into ``LoraSpec``
(manifest.py), required to hold its neutral value because loraplex does not execute the feature
(``_FEATURE_VALUES`` / ``_OFF_FEATURES``), or ignored because it only affects training or
initialisation (``_IGNORED``). A key PEFT adds later is accepted only while it is off (null,
false, empty): an unknown feature that is switched on could change what the adapter computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from loraplex.artifacts.base_model import TARGET_MODULES
from loraplex.artifacts.config_regex import ConfigRegex, check_entry_count, check_field_budget
from loraplex.errors import AdapterConfigError, UnsupportedAdapterError

_PARSED = frozenset(
    {
        "peft_type",
        "task_type",
        "base_model_name_or_path",
        "r",
        "lora_alpha",
        "use_rslora",
        "target_modules",
        "rank_pattern",
        "alpha_pattern",
        "layers_to_transform",
        "layers_pattern",
        "exclude_modules",
    }
)
# Features with one value loraplex supports: (key, neutral value, what the neutral value means).
_FEATURE_VALUES: tuple[tuple[str, object, str], ...] = (
    ("fan_in_fan_out", False, "false (Llama linears store weights as (out, in))"),
    ("bias", "none", '"none" (trained biases are not supported)'),
    ("use_dora", False, "false (DoRA is not supported)"),
    ("lora_bias", False, "false (LoRA bias terms are not supported)"),
    ("use_qalora", False, "false (QA-LoRA is not supported)"),
)
# Features that must be absent, null, false or empty.
_OFF_FEATURES = frozenset(
    {
        "modules_to_save",
        "target_parameters",
        "trainable_token_indices",
        "layer_replication",
        "megatron_config",
        "alora_invocation_tokens",
        "use_bdlora",
        "arrow_config",
        "kasa_config",
        "velora_config",
        "monteclora_config",
    }
)
# Training, initialisation and bookkeeping options that do not change the saved weights' meaning.
_IGNORED = frozenset(
    {
        "auto_mapping",
        "peft_version",
        "revision",
        "inference_mode",
        "lora_dropout",
        "init_lora_weights",
        "loftq_config",
        "eva_config",
        "corda_config",
        "lora_ga_config",
        "qalora_group_size",
        "runtime_config",
        "megatron_core",
        "ensure_weight_tying",
    }
)
# init_lora_weights values that leave the base weights untouched. PiSSA, OLoRA, CorDA, LoftQ and
# LoRA-GA rewrite the base weights at init, so their adapters only work on that modified base.
_SAFE_INITS: tuple[object, ...] = (True, False, "gaussian", "eva", "orthogonal")
# How PEFT embeds rank_pattern / alpha_pattern keys and layers_pattern names in its regexes.
PATTERN_KEY_TEMPLATE = r"(.*\.)?({})$"
LAYERS_PATTERN_TEMPLATE = r"(?:^|.*?\.){}\.(?P<idx>\d+)\."
# target_modules="all-linear" means every linear layer except the output head.
_ALL_LINEAR = "all-linear"
# Non-injectable modules a regex target must not reach (tensor checks catch the rest).
_FORBIDDEN_PATHS = ("lm_head", "model.embed_tokens")


def check_features(mapping: Mapping[str, object]) -> None:
    """Reject every PEFT feature loraplex does not execute, naming the field."""
    for key, neutral, expected in _FEATURE_VALUES:
        value = mapping.get(key, neutral)
        if value is None and key != "bias":
            continue
        if value != neutral or type(value) is not type(neutral):
            raise UnsupportedAdapterError(key, value, expected)
    for key in sorted(_OFF_FEATURES):
        if _is_on(mapping.get(key)):
            raise UnsupportedAdapterError(key, mapping.get(key), "null or empty (not supported)")
    init = mapping.get("init_lora_weights", True)
    if not any(init == safe and type(init) is type(safe) for safe in _SAFE_INITS):
        raise UnsupportedAdapterError(
            "init_lora_weights", init, f"one of {_SAFE_INITS} (this init modifies the base weights)"
        )
    for key in sorted(set(mapping) - _PARSED - _IGNORED - _OFF_FEATURES):
        if key not in {k for k, _, _ in _FEATURE_VALUES} and _is_on(mapping[key]):
            raise UnsupportedAdapterError(key, mapping[key], "absent (unknown PEFT feature)")


def check_ignored_numbers(mapping: Mapping[str, object]) -> None:
    """``lora_dropout`` only acts in training, so inference ignores it; a NaN or +/-inf there
    (JSON's non-standard ``NaN`` / ``Infinity``, which Python's parser reads) is still no
    config PEFT trained with: refused, not carried into the manifest unnoticed."""
    value = mapping.get("lora_dropout")
    if isinstance(value, float) and not math.isfinite(value):
        raise AdapterConfigError("lora_dropout", value, "a finite number (dropout probability)")


def _is_on(value: object) -> bool:
    return value is not None and value is not False and value not in ({}, [])


# Bounds of a rank (``r``, ``rank_pattern``) and an alpha (``lora_alpha``, ``alpha_pattern``).
# NOTE: JSON integers have no size limit: a rank of 400 digits passed as "an int > 0" and its
# scale (alpha / r) raised OverflowError, a 500 on the admin API. The engine holds every module's
# scale in float32 and applies it in the LoRA op, which raised for any scale past float32's
# largest value ("value cannot be converted to type float without overflow"): an alpha of 1e39
# registered, then every request of that revision failed. A scale is at most its alpha (r >= 1).
MAX_RANK = 2**31 - 1
MAX_ALPHA = 3.4028234663852886e38  # float32's largest finite value
_RANK_EXPECTED = f"an int > 0 and <= {MAX_RANK}"
_ALPHA_EXPECTED = f"a finite number > 0 and <= {MAX_ALPHA:g} (float32's largest)"


def expect_int(mapping: Mapping[str, object], field: str, default: int) -> int:
    value = mapping.get(field, default)
    if not is_rank(value):
        raise AdapterConfigError(field, value, _RANK_EXPECTED)
    return value  # type: ignore[return-value]


def is_rank(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_RANK


def expect_number(mapping: Mapping[str, object], field: str, default: float) -> float:
    value = mapping.get(field, default)
    if not _alpha(value):
        raise AdapterConfigError(field, value, _ALPHA_EXPECTED)
    return float(value)  # type: ignore[arg-type]


def _alpha(value: object) -> bool:
    """A number in (0, MAX_ALPHA]; compared as it is, so a huge int never meets ``float()``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return 0 < value <= MAX_ALPHA  # NaN fails both comparisons


def expect_bool(mapping: Mapping[str, object], field: str, default: bool) -> bool:
    value = mapping.get(field, default)
    if not isinstance(value, bool):
        raise AdapterConfigError(field, value, "true or false")
    return value


def expect_optional_str(mapping: Mapping[str, object], field: str) -> str | None:
    value = mapping.get(field)
    if value is not None and not isinstance(value, str):
        raise AdapterConfigError(field, value, "a string or null")
    return value


def parse_target_modules(value: object) -> tuple[str, ...] | str:
    """A tuple of module-name suffixes, or one regex string (PEFT's two forms)."""
    if value == _ALL_LINEAR:
        return TARGET_MODULES
    if isinstance(value, str):
        regex = ConfigRegex("target_modules", value)
        for path in _FORBIDDEN_PATHS:
            if regex.fullmatch(path):
                raise UnsupportedAdapterError(
                    "target_modules",
                    value,
                    f"a regex not matching {path!r} (only linear "
                    f"projections {', '.join(TARGET_MODULES)} can be adapted)",
                )
        return value
    names = _str_list("target_modules", value, allow_empty=False)
    for name in names:
        if name.rsplit(".", 1)[-1] not in TARGET_MODULES:
            raise UnsupportedAdapterError(
                "target_modules", name, f"names ending in one of {', '.join(TARGET_MODULES)}"
            )
    return names


def parse_pattern(
    mapping: Mapping[str, object], field: str, integer: bool
) -> tuple[tuple[str, float], ...]:
    """``rank_pattern`` / ``alpha_pattern``: regex keys (order kept) to positive values."""
    value = mapping.get(field)
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise AdapterConfigError(field, value, "an object mapping module regex to a value")
    check_entry_count(field, value)
    check_field_budget(field, [ConfigRegex(field, key, PATTERN_KEY_TEMPLATE) for key in value])
    entries: list[tuple[str, float]] = []
    for key, item in value.items():
        if integer and not is_rank(item):
            raise AdapterConfigError(f"{field}[{key!r}]", item, _RANK_EXPECTED)
        if not integer and not _alpha(item):
            raise AdapterConfigError(f"{field}[{key!r}]", item, _ALPHA_EXPECTED)
        entries.append((key, item))
    return tuple(entries)


def parse_layers(value: object) -> tuple[int, ...] | None:
    """``layers_to_transform``: null, one layer index, or a list of them; empty means all."""
    if value is None or value == []:
        return None
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(items, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items
    ):
        raise AdapterConfigError(
            "layers_to_transform", value, "null, an int >= 0, or a list of them"
        )
    check_entry_count("layers_to_transform", items)
    return tuple(items)


# What parse_layers / parse_layers_pattern read as "not set".
_EMPTY: tuple[object, ...] = (None, "", [])


def check_layer_fields(mapping: Mapping[str, object]) -> None:
    """``layers_to_transform`` / ``layers_pattern`` only filter a list of ``target_modules``, and
    ``layers_pattern`` only names where the indices of ``layers_to_transform`` are: PEFT's
    ``LoraConfig`` refuses them beside a regex (and ``layers_pattern`` alone); an empty
    ``layers_to_transform`` selects every layer, so a ``layers_pattern`` beside it does nothing."""
    regex = isinstance(mapping.get("target_modules"), str)
    for field in ("layers_to_transform", "layers_pattern"):
        if regex and mapping.get(field) is not None:
            raise AdapterConfigError(
                field,
                mapping[field],
                "null when target_modules is a regex (the regex alone "
                "selects the modules; PEFT refuses both)",
            )
    if mapping.get("layers_pattern") not in _EMPTY and mapping.get("layers_to_transform") in _EMPTY:
        raise AdapterConfigError(
            "layers_pattern",
            mapping["layers_pattern"],
            "null unless layers_to_transform names layers (it only says where their indices are)",
        )


def parse_layers_pattern(value: object) -> tuple[str, ...] | None:
    if value is None or value in ("", []):
        return None
    names = (value,) if isinstance(value, str) else _str_list("layers_pattern", value, True)
    patterns = [ConfigRegex("layers_pattern", name, LAYERS_PATTERN_TEMPLATE) for name in names]
    check_field_budget("layers_pattern", patterns)
    return names


def parse_exclude_modules(value: object) -> tuple[str, ...] | str | None:
    if value is None or value in ("", []):
        return None
    if isinstance(value, str):
        ConfigRegex("exclude_modules", value)
        return value
    return _str_list("exclude_modules", value, allow_empty=True)


def _str_list(field: str, value: object, allow_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) and s for s in value):
        raise AdapterConfigError(field, value, "a list of non-empty strings or a regex string")
    if not value and not allow_empty:
        raise AdapterConfigError(field, value, "at least one module name")
    check_entry_count(field, value)
    return tuple(value)
