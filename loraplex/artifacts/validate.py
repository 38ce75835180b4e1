"""Validate a PEFT adapter directory against the served base model, before any memory is reserved.

Torch-free. Order matters: file names are checked first (a pickle file is rejected without being
opened), then the config, the base model and ranks, then the safetensors header (sizes checked
against the real file), then tensor names, shapes and dtypes, and only then are values read
(in bounded chunks) for finiteness, hashed in the same pass.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.base_model import ATTENTION_MODULES, TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.config_reach import check_reach, exclude_warnings
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.manifest import LoraSpec, read_adapter_config
from loraplex.artifacts.safetensors_header import (
    SafetensorsHeader,
    TensorHeaderEntry,
    parse_safetensors_header,
)
from loraplex.artifacts.tensor_values import HashingReader, check_finite
from loraplex.dtypes import SAFETENSORS_CODES, bytes_per_element
from loraplex.errors import (
    AdapterConfigError,
    BaseModelMismatchError,
    CorruptArtifactError,
    NotAnAdapterDirError,
    RankTooLargeError,
    TensorValidationError,
    UnsafeFormatError,
)

WEIGHTS_FILE = "adapter_model.safetensors"
# Formats that deserialize with pickle and so can run code when loaded: never opened.
UNSAFE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
_TENSOR_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(0|[1-9]\d*)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)\.weight"
)


@dataclass(frozen=True)
class InjectedModule:
    """One base linear layer the adapter modifies, with its resolved rank and scale."""

    layer: int  # decoder layer index
    module: str  # target module name, e.g. "q_proj"
    rank: int  # pattern-resolved rank
    scale: float  # pattern-resolved PEFT scaling (alpha/r or alpha/sqrt(r))
    d_in: int  # input width of the base linear (columns of A)
    d_out: int  # output width of the base linear (rows of B)


@dataclass(frozen=True)
class AdapterTensor:
    """One validated tensor of ``adapter_model.safetensors`` and where its bytes are."""

    name: str  # name in the file (PEFT's saved form)
    layer: int  # decoder layer index
    module: str  # target module name
    kind: str  # "A" (shape [rank, d_in]) or "B" (shape [d_out, rank])
    shape: tuple[int, ...]  # validated shape
    dtype: str  # "float32", "float16" or "bfloat16"
    file_offset: int  # absolute byte offset of the tensor's data in the file
    num_bytes: int  # length of the tensor's data in bytes (little-endian, row-major)


@dataclass(frozen=True)
class ValidatedAdapter:
    """An adapter directory that passed every check; what loaders and budgets need to know."""

    path: Path  # the adapter directory
    spec: LoraSpec  # parsed adapter_config.json
    digest: str  # sha256 of adapter_model.safetensors
    base_digest: str  # digest of the base model it was validated against
    dtype: str  # the one dtype of all tensors: "float32", "float16" or "bfloat16"
    tensors: tuple[AdapterTensor, ...]  # ordered by layer, module (execution order), A then B
    modules: tuple[InjectedModule, ...]  # injected modules, ordered by layer then module
    tensor_bytes: int  # bytes of tensor data actually stored
    estimated_bytes: int  # sum over modules of (d_in + d_out) * rank * bytes_per_param
    max_rank: int  # largest rank over the injected modules
    # What passed but may not be what the author meant (``config_reach.exclude_warnings``);
    # registration logs them and answers them to the registering caller.
    warnings: tuple[str, ...] = ()

    @property
    def weights_path(self) -> Path:
        """The validated safetensors file."""
        return self.path / WEIGHTS_FILE

    def key(self, tenant: str, name: str, revision: str) -> AdapterKey:
        """The immutable identity of this adapter as ``tenant/name@revision`` on its base."""
        return AdapterKey(self.base_digest, tenant, name, revision, self.digest)


def validate_adapter_dir(
    adapter_dir: Path, base: BaseModelSpec, max_lora_rank: int
) -> ValidatedAdapter:
    """Check everything about ``adapter_dir`` against ``base``; raise a typed error on the first
    problem (UnsafeFormatError, AdapterConfigError and subclasses, BaseModelMismatchError,
    CorruptArtifactError, TensorValidationError)."""
    if max_lora_rank <= 0:
        raise ValueError(f"max_lora_rank {max_lora_rank} is invalid; expected > 0")
    weights = _check_files(adapter_dir)
    spec = read_adapter_config(adapter_dir)
    check_base_model(spec, base)
    modules = injected_modules(spec, base)
    _check_ranks(spec, modules, max_lora_rank)
    with weights.open("rb") as handle:
        reader = HashingReader(handle)
        header = parse_safetensors_header(reader, weights, os.fstat(handle.fileno()).st_size)
        tensors = _match_tensors(header, modules)
        _scan_values(reader, header)
    dtype = tensors[0].dtype
    bytes_per_param = bytes_per_element(dtype)
    return ValidatedAdapter(
        path=adapter_dir,
        spec=spec,
        digest=reader.hexdigest(),
        base_digest=base.digest,
        dtype=dtype,
        tensors=tensors,
        modules=modules,
        tensor_bytes=sum(tensor.num_bytes for tensor in tensors),
        estimated_bytes=sum((m.d_in + m.d_out) * m.rank * bytes_per_param for m in modules),
        max_rank=max(m.rank for m in modules),
        warnings=exclude_warnings(spec.matcher(), base),
    )


def check_base_model(spec: LoraSpec, base: BaseModelSpec) -> None:
    """The adapter's recorded base model (final path component) must be the served one: the
    name of the directory the base model is served from. NOTE: the message says how to match
    them; it named the two only, and an adapter trained on a copy of the base under another
    name (``/mnt/ckpt/base``) left its owner guessing which side to change."""
    recorded = spec.base_model_name_or_path
    if not recorded:
        return
    final = recorded.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if final != base.name:
        raise BaseModelMismatchError(
            f"adapter_config.json: base_model_name_or_path {recorded!r} names {final!r}; "
            f"expected the served base model {base.name!r} (the name of the directory it is "
            f"served from); if the adapter was trained on these weights under another name, "
            f"set base_model_name_or_path to {base.name!r} (or leave it out), or serve them "
            f"from a directory named {final!r}"
        )


def injected_modules(spec: LoraSpec, base: BaseModelSpec) -> tuple[InjectedModule, ...]:
    """Every (layer, module) of ``base`` that ``spec`` targets, with rank, scale and widths;
    a selector entry that selects nothing is refused (``config_reach``)."""
    out_of_range = [i for i in spec.layers_to_transform or () if i >= base.num_layers]
    if out_of_range and not isinstance(spec.target_modules, str):
        raise BaseModelMismatchError(
            f"adapter_config.json: layers_to_transform {list(spec.layers_to_transform or ())} "
            f"names layers {out_of_range}; expected indices < {base.num_layers} "
            f"(base model {base.name!r})"
        )
    matcher = spec.matcher()  # compiles the config's regexes once for every module below
    modules: list[InjectedModule] = []
    for layer in range(base.num_layers):
        for module in TARGET_MODULES:
            if matcher.targets(layer, module):
                d_in, d_out = base.module_shape(module)
                rank = matcher.rank_for(layer, module)
                scale = spec.scale(rank, matcher.alpha_for(layer, module))
                modules.append(InjectedModule(layer, module, rank, scale, d_in, d_out))
    if not modules:
        raise AdapterConfigError(
            "target_modules",
            spec.target_modules,
            f"to match at least one of {', '.join(TARGET_MODULES)} in layers "
            f"0..{base.num_layers - 1} of {base.name!r}",
        )
    check_reach(matcher, base, [(m.layer, m.module) for m in modules])
    return tuple(modules)


def _scan_values(reader: HashingReader, header: SafetensorsHeader) -> None:
    """Read the data section in file order (entries tile it), checking each tensor is finite."""
    for entry in header.entries:
        check_finite(reader, entry.name, entry.dtype, entry.num_bytes)
    if reader.read(1):
        raise CorruptArtifactError(f"{header.path}: file grew while it was being validated")


def _check_ranks(spec: LoraSpec, modules: tuple[InjectedModule, ...], max_lora_rank: int) -> None:
    for module in modules:
        if module.rank > max_lora_rank:
            raise RankTooLargeError(
                spec.rank_source(module.layer, module.module),
                module.rank,
                f"<= max_lora_rank {max_lora_rank} (layer {module.layer} {module.module})",
            )


def _check_files(adapter_dir: Path) -> Path:
    """Reject pickle formats by name only, then require the two PEFT files."""
    if not adapter_dir.is_dir():
        raise NotAnAdapterDirError(str(adapter_dir))
    with os.scandir(adapter_dir) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        if Path(name).suffix.lower() in UNSAFE_SUFFIXES:
            raise UnsafeFormatError(
                f"{adapter_dir / name}: {Path(name).suffix} files are pickle-based and can run "
                f"code when loaded; not opened. Expected only {WEIGHTS_FILE} for weights"
            )
    weights = adapter_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise CorruptArtifactError(f"{weights}: missing; expected a regular safetensors file")
    return weights


def _match_tensors(
    header: SafetensorsHeader, modules: tuple[InjectedModule, ...]
) -> tuple[AdapterTensor, ...]:
    """Each header entry must be the A or B of an injected module, shaped and typed right."""
    by_position = {(m.layer, m.module): m for m in modules}
    found: dict[tuple[int, str, str], AdapterTensor] = {}
    first_dtype: str | None = None
    for entry in header.entries:
        layer, module_name, kind = _parse_name(entry.name)
        module = by_position.get((layer, module_name))
        if module is None:
            raise TensorValidationError(
                f"tensor {entry.name!r}: layer {layer} {module_name} is not targeted by "
                "adapter_config.json; expected no extra tensors"
            )
        first_dtype = first_dtype or entry.dtype
        found[(layer, module_name, kind)] = _tensor(header, entry, module, kind, first_dtype)
    ordered: list[AdapterTensor] = []
    for module in modules:
        for kind in ("A", "B"):
            tensor = found.get((module.layer, module.module, kind))
            if tensor is None:
                raise TensorValidationError(
                    f"tensor {_expected_name(module, kind)!r} is missing; expected lora_A and "
                    f"lora_B for every targeted module"
                )
            ordered.append(tensor)
    return tuple(ordered)


def _tensor(
    header: SafetensorsHeader,
    entry: TensorHeaderEntry,
    module: InjectedModule,
    kind: str,
    first_dtype: str,
) -> AdapterTensor:
    if entry.dtype not in SAFETENSORS_CODES:
        raise TensorValidationError(
            f"tensor {entry.name!r}: dtype {entry.dtype}; expected one of "
            f"{', '.join(SAFETENSORS_CODES)}"
        )
    if entry.dtype != first_dtype:
        raise TensorValidationError(
            f"tensor {entry.name!r}: dtype {entry.dtype} differs from {first_dtype} of the "
            "other tensors; expected one dtype for all tensors"
        )
    shape = (module.rank, module.d_in) if kind == "A" else (module.d_out, module.rank)
    if entry.shape != shape:
        raise TensorValidationError(
            f"tensor {entry.name!r}: shape {list(entry.shape)}; expected {list(shape)} "
            f"(rank {module.rank}, d_in {module.d_in}, d_out {module.d_out})"
        )
    return AdapterTensor(
        name=entry.name,
        layer=module.layer,
        module=module.module,
        kind=kind,
        shape=shape,
        dtype=SAFETENSORS_CODES[entry.dtype],
        file_offset=header.absolute_offset(entry),
        num_bytes=entry.num_bytes,
    )


def _parse_name(name: str) -> tuple[int, str, str]:
    match = _TENSOR_NAME.fullmatch(name)
    block = "self_attn" if match and match.group(3) in ATTENTION_MODULES else "mlp"
    if match is None or match.group(3) not in TARGET_MODULES or match.group(2) != block:
        raise TensorValidationError(
            f"tensor {name!r}: unexpected name; expected base_model.model.model.layers.<i>."
            "<self_attn|mlp>.<q|k|v|o|gate|up|down>_proj.lora_<A|B>.weight"
        )
    return int(match.group(1)), match.group(3), match.group(4)


def _expected_name(module: InjectedModule, kind: str) -> str:
    path = BaseModelSpec.module_path(module.layer, module.module)
    return f"base_model.model.{path}.lora_{kind}.weight"
