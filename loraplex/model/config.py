"""``config.json`` of a Llama-family checkpoint, parsed once into frozen, validated objects.

Both spellings Hugging Face has used are accepted: ``rope_theta`` + ``rope_scaling`` (transformers
4.x, ``type`` or ``rope_type``) and ``rope_parameters`` (transformers 5.x, theta inside).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.artifacts.base_model import SUPPORTED_ARCHITECTURES
from loraplex.errors import CheckpointError

ROPE_TYPES = frozenset({"default", "linear", "dynamic", "llama3", "yarn"})


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters; which fields matter depends on ``rope_type``."""

    rope_type: str  # one of ROPE_TYPES
    theta: float  # base wavelength
    factor: float  # context extension factor (1.0 for default)
    original_max_position_embeddings: int  # pretraining context (llama3, yarn)
    low_freq_factor: float  # llama3 only
    high_freq_factor: float  # llama3 only
    beta_fast: float  # yarn: extrapolation boundary (rotations)
    beta_slow: float  # yarn: interpolation boundary (rotations)
    attention_factor: float | None  # yarn: cos/sin scale; None = derived from factor/mscale
    mscale: float | None  # yarn (DeepSeek style) attention factor numerator
    mscale_all_dim: float | None  # yarn attention factor denominator
    truncate: bool  # yarn: round the correction range to whole dimensions

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type {self.rope_type!r} is invalid; expected one of {sorted(ROPE_TYPES)}"
            )
        if not (self.theta > 0 and math.isfinite(self.theta)):
            raise ValueError(f"theta {self.theta} is invalid; expected a finite number > 0")
        if not self.factor > 0:
            raise ValueError(f"factor {self.factor} is invalid; expected > 0")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor {self.high_freq_factor} is invalid; expected > low_freq_factor "
                f"{self.low_freq_factor}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs from ``config.json``."""

    architecture: str  # LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM
    vocab_size: int  # embedding rows
    hidden_size: int  # model width
    intermediate_size: int  # SwiGLU width
    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width
    rms_norm_eps: float  # RMSNorm epsilon
    max_position_embeddings: int  # trained context (dynamic RoPE scales beyond it)
    rope: RopeConfig  # rotary embedding parameters
    tie_word_embeddings: bool  # lm_head shares the embedding matrix
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2; Llama attention_bias)
    o_bias: bool  # o_proj carries a bias (Llama attention_bias)
    mlp_bias: bool  # gate/up/down carry a bias (Llama mlp_bias)
    sliding_windows: tuple[int | None, ...]  # per layer: attention window, None = full causal
    eos_token_ids: tuple[int, ...]  # end-of-sequence ids named by config.json

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {self.architecture!r} is invalid; expected one of "
                f"{sorted(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads {self.num_kv_heads} is invalid; expected a divisor of "
                f"num_heads {self.num_heads}"
            )
        if len(self.sliding_windows) != self.num_layers:
            raise ValueError(
                f"sliding_windows has {len(self.sliding_windows)} entries; expected num_layers "
                f"{self.num_layers}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is invalid; expected an even number")

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        path = model_dir / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: cannot read config ({exc})") from exc
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: top level is {type(raw).__name__}, expected object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse a config mapping; unsupported features raise CheckpointError naming the field."""
        architectures = raw.get("architectures") or []
        architecture = str(architectures[0]) if architectures else "?"
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(
                f"config.json: architectures is {architectures!r}; expected one of "
                f"{sorted(SUPPORTED_ARCHITECTURES)}"
            )
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"config.json: hidden_act is {act!r}; expected 'silu'")
        num_layers = _int(raw, "num_hidden_layers")
        num_heads = _int(raw, "num_attention_heads")
        hidden = _int(raw, "hidden_size")
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        attention_bias = bool(raw.get("attention_bias", False))
        try:
            return cls(
                architecture=architecture,
                vocab_size=_int(raw, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_int(raw, "intermediate_size"),
                num_layers=num_layers,
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or hidden // num_heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=_int(raw, "max_position_embeddings"),
                rope=parse_rope(raw),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=is_qwen2 or attention_bias,
                o_bias=attention_bias and not is_qwen2,
                mlp_bias=bool(raw.get("mlp_bias", False)),
                sliding_windows=_sliding_windows(raw, architecture, num_layers),
                eos_token_ids=_token_ids(raw.get("eos_token_id")),
            )
        except ValueError as exc:
            raise CheckpointError(f"config.json: {exc}") from exc


def parse_rope(raw: dict[str, Any]) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"config.json: rope_type is {rope_type!r}; expected one of {sorted(ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise CheckpointError(f"config.json: partial_rotary_factor is {partial!r}; expected 1.0")
    max_positions = _int(raw, "max_position_embeddings")
    original = int(
        raw.get("original_max_position_embeddings")
        or params.get("original_max_position_embeddings")
        or max_positions
    )
    factor = params.get("factor")
    if factor is None:
        # NOTE: yarn without a factor derives it from the context extension, as transformers does.
        factor = max_positions / original if rope_type == "yarn" else 1.0
    return RopeConfig(
        rope_type=rope_type,
        theta=float(params.get("rope_theta") or raw.get("rope_theta") or 10_000.0),
        factor=float(factor),
        original_max_position_embeddings=original,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=_opt_float(params.get("attention_factor")),
        mscale=_opt_float(params.get("mscale")),
        mscale_all_dim=_opt_float(params.get("mscale_all_dim")),
        truncate=bool(params.get("truncate", True)),
    )


def context_window(raw: dict[str, Any]) -> tuple[int, str]:
    """The most tokens one sequence may hold on the checkpoint of config ``raw`` (vLLM's ceiling
    on ``max_model_len``), and how it follows from ``config.json``: ``max_position_embeddings``,
    extended by a rope scaling that reaches positions beyond it as ``model/rope.py`` applies it
    (``linear``, ``dynamic``: times ``factor``; ``yarn``: ``original_max_position_embeddings``
    times ``factor``). ``llama3`` rescales frequencies inside ``max_position_embeddings``
    (already its extended context) and ``default`` scales nothing, as vLLM derives it."""
    max_positions = _int(raw, "max_position_embeddings")
    rope = parse_rope(raw)
    if rope.rope_type in ("linear", "dynamic"):
        window = int(max_positions * rope.factor)
        how = f"max_position_embeddings {max_positions} x {rope.rope_type} rope_scaling factor"
    elif rope.rope_type == "yarn":
        max_positions = rope.original_max_position_embeddings
        window = int(max_positions * rope.factor)
        how = f"original_max_position_embeddings {max_positions} x yarn rope_scaling factor"
    else:
        return max_positions, f"max_position_embeddings {max_positions}"
    return max(1, window), f"{how} {rope.factor:g}"


def check_max_model_len(max_model_len: int, raw: dict[str, Any]) -> None:
    """ValueError naming ``max_model_len`` when it is above ``context_window(raw)``: positions
    past it were never trained (vLLM refuses it too). NOTE: it was accepted in silence."""
    window, how = context_window(raw)
    if max_model_len > window:
        raise ValueError(
            f"max_model_len {max_model_len} is invalid; expected at most {window}, the model's "
            f"context ({how} in its config.json)"
        )


def _sliding_windows(
    raw: dict[str, Any], architecture: str, num_layers: int
) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    if architecture == "Qwen2ForCausalLM":
        if not raw.get("use_sliding_window") or window is None:
            return (None,) * num_layers
        # Qwen2 slides only from layer max_window_layers on (or where layer_types says so).
        layer_types = raw.get("layer_types")
        if isinstance(layer_types, list) and len(layer_types) == num_layers:
            return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
        first = int(raw.get("max_window_layers", 0))
        return tuple(int(window) if i >= first else None for i in range(num_layers))
    if architecture == "MistralForCausalLM" and window is not None:
        return (int(window),) * num_layers
    return (None,) * num_layers


def _int(raw: dict[str, Any], field: str) -> int:
    value = raw.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config.json: field {field!r} is {value!r}; expected an int > 0")
    return value


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _token_ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise CheckpointError(f"config.json: eos_token_id is {value!r}; expected an int or list")
