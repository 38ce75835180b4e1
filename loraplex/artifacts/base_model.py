"""What an adapter is validated against: the served base model's architecture and identity.

Torch-free: the control plane validates registrations with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from loraplex.errors import BaseModelMismatchError, CorruptArtifactError

# Architectures whose weight layout loraplex implements (Llama family).
SUPPORTED_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
# Every linear layer an adapter may target, in execution order within a decoder layer.
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES

_DIGEST_CHUNK_BYTES = 1 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class BaseModelSpec:
    """Shapes of the injectable linear layers of a Llama-family checkpoint, plus its identity."""

    name: str  # the name adapters refer to in base_model_name_or_path (the directory name)
    architecture: str  # config.json "architectures"[0]
    hidden_size: int  # model width
    intermediate_size: int  # SwiGLU MLP width
    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width
    vocab_size: int  # tokenizer vocabulary
    digest: str  # sha256 over config.json and the weight files, see base_model_digest

    def module_shape(self, module: str) -> tuple[int, int]:
        """``(d_in, d_out)`` of a target module (``q_proj`` ... ``down_proj``)."""
        q_width = self.num_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden_size, q_width),
            "k_proj": (self.hidden_size, kv_width),
            "v_proj": (self.hidden_size, kv_width),
            "o_proj": (q_width, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        if module not in shapes:
            raise KeyError(f"module {module!r} is not one of {', '.join(TARGET_MODULES)}")
        return shapes[module]

    @staticmethod
    def module_path(layer: int, module: str) -> str:
        """The module's path in a Hugging Face checkpoint, e.g. ``model.layers.3.mlp.up_proj``."""
        block = "self_attn" if module in ATTENTION_MODULES else "mlp"
        return f"model.layers.{layer}.{block}.{module}"

    @classmethod
    def from_dir(cls, model_dir: Path, digested: DigestedCheckpoint | None = None) -> BaseModelSpec:
        """Read ``config.json`` and digest the checkpoint in ``model_dir``; ``digested``: its
        digest taken before, used while it still ``matches`` (no second read of the weights)."""
        config = read_model_config(model_dir)
        if digested is not None and digested.matches(model_dir):
            return cls.from_config(model_dir.name, config, digested.digest)
        return cls.from_config(model_dir.name, config, base_model_digest(model_dir))

    @classmethod
    def from_config(cls, name: str, config: dict[str, object], digest: str) -> BaseModelSpec:
        architectures = config.get("architectures") or [config.get("model_type", "?")]
        architecture = str(architectures[0]) if isinstance(architectures, list) else "?"
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise BaseModelMismatchError(
                f"config.json: architecture {architecture!r} is not supported; expected one of "
                f"{sorted(SUPPORTED_ARCHITECTURES)}"
            )
        hidden = _int_field(config, "hidden_size")
        num_heads = _int_field(config, "num_attention_heads")
        num_kv_heads = _int_field(config, "num_key_value_heads", default=num_heads)
        if num_heads % num_kv_heads:
            raise CorruptArtifactError(
                f"config.json: num_attention_heads {num_heads} is not a multiple of "
                f"num_key_value_heads {num_kv_heads}"
            )
        return cls(
            name=name,
            architecture=architecture,
            hidden_size=hidden,
            intermediate_size=_int_field(config, "intermediate_size"),
            num_layers=_int_field(config, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=_int_field(config, "head_dim", default=hidden // num_heads or None),
            vocab_size=_int_field(config, "vocab_size"),
            digest=digest,
        )


def lora_bytes(
    spec: BaseModelSpec, rank: int, bytes_per_param: int, modules: Sequence[str] = TARGET_MODULES
) -> int:
    """Bytes of LoRA pairs of ``rank`` on ``modules`` of every layer: the one slot-bytes formula
    (the slot pool's capacity per slot, ``loraplex serve``'s byte budgets, the replays' sizes),
    ``sum_layers sum_modules (d_in + d_out) * rank * bytes_per_param`` (DESIGN.md §2)."""
    widths = sum(sum(spec.module_shape(module)) for module in modules)
    return spec.num_layers * widths * rank * bytes_per_param


def read_model_config(model_dir: Path) -> dict[str, object]:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise BaseModelMismatchError(f"{path}: no config.json; expected a model directory") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptArtifactError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise CorruptArtifactError(f"{path}: top level is {type(config).__name__}, expected object")
    return config


# One file as ``os.stat`` saw it: (name, inode, size, mtime_ns, ctime_ns).
FileStamp = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class DigestedCheckpoint:
    """A checkpoint's digest (``base_model_digest``) with its files as ``os.stat`` saw them
    both before and after it was read. The server digests the base model, then its engine
    process needs the same digest: on the large preset a second read of 720 MiB, about 0.7 s of
    the engine's start on its critical path. The engine takes this one instead while every file
    still stats the same (a restart after the files changed digests them again).

    NOTE: trusts that a file whose inode, size, mtime and ctime are unchanged has its bytes
    unchanged; ctime cannot be set back without changing the system clock."""

    model_dir: Path  # the directory digested
    stamps: tuple[FileStamp, ...] | None  # None: a file changed while it was read
    digest: str  # base_model_digest(model_dir) as read

    def matches(self, model_dir: Path) -> bool:
        """Whether ``digest`` is still ``model_dir``'s (same directory, every file unchanged)."""
        same_dir = self.model_dir == model_dir
        return same_dir and self.stamps is not None and self.stamps == _stamps(model_dir)

    def covers(self, read: ReadStamps) -> bool:
        """Whether bytes read from the checkpoint while ``read`` was taken are the bytes this
        digest is of: the same directory, and every file stats as the digest's both before and
        after that read (``read_stamps``)."""
        same = self.stamps is not None and read.before == self.stamps == read.after
        return same and read.model_dir == self.model_dir


@dataclass(frozen=True)
class ReadStamps:
    """A checkpoint's files as ``os.stat`` saw them before and after something read them (the
    engine process's load started before the server's digest was known to it:
    ``DigestedCheckpoint.covers``)."""

    model_dir: Path
    before: tuple[FileStamp, ...]
    after: tuple[FileStamp, ...]


def read_stamps(model_dir: Path, read: Callable[[], T]) -> tuple[T, ReadStamps]:
    """``read()`` with the checkpoint's file stamps taken before and after it."""
    before = _stamps(model_dir)
    value = read()
    return value, ReadStamps(model_dir, before, _stamps(model_dir))


def digest_checkpoint(model_dir: Path) -> DigestedCheckpoint:
    """``base_model_digest(model_dir)`` with the stamps that let another process reuse it."""
    before = _stamps(model_dir)
    digest = base_model_digest(model_dir)
    unchanged = _stamps(model_dir) == before
    return DigestedCheckpoint(model_dir, before if unchanged else None, digest)


def _digested_files(model_dir: Path) -> list[Path]:
    return [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]


def _stamps(model_dir: Path) -> tuple[FileStamp, ...]:
    stamps = []
    for path in _digested_files(model_dir):
        st = path.stat()
        stamps.append((path.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


def base_model_digest(model_dir: Path) -> str:
    """sha256 over ``config.json`` and every ``*.safetensors`` file, in name order.

    Each file contributes its name and length before its bytes, so moving bytes between files
    changes the digest. Tokenizer files are excluded: they do not change what an adapter does.
    """
    files = _digested_files(model_dir)
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            while chunk := handle.read(_DIGEST_CHUNK_BYTES):
                digest.update(chunk)
    return digest.hexdigest()


def _int_field(config: dict[str, object], field: str, default: int | None = None) -> int:
    """A positive int field; ``default`` stands in when the field is absent or null."""
    value = config.get(field)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CorruptArtifactError(
            f"config.json: field {field!r} is {value!r}; expected an int > 0"
        )
    return value
