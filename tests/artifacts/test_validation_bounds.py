"""Validation cost is bounded by its inputs: a hostile header length is refused on its 8-byte
prefix, config regexes run on RE2 (linear time, no backtracking features) with capped sizes, and
for ordinary patterns RE2 resolves exactly the modules PEFT's ``re`` calls resolve."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loraplex.artifacts import validate
from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.config_regex import (
    MAX_CONFIG_ENTRIES,
    MAX_FIELD_PROGRAM_SIZE,
    MAX_PATTERN_CHARS,
    MAX_PROGRAM_SIZE,
    ConfigRegex,
)
from loraplex.artifacts.manifest import parse_adapter_config
from loraplex.artifacts.safetensors_header import MAX_HEADER_BYTES, parse_safetensors_header
from loraplex.artifacts.tensor_values import HashingReader
from loraplex.errors import AdapterConfigError, CorruptArtifactError

HUGE_HEADER = 100_000_000  # what the attacker's file claimed (and held)


class CountingReader:
    """A reader that counts the bytes it hands out."""

    def __init__(self, path: Path) -> None:
        self._handle = path.open("rb")
        self.bytes_read = 0

    def read(self, size: int, /) -> bytes:
        data = self._handle.read(size)
        self.bytes_read += len(data)
        return data


def sparse_weights(path: Path, header_len: int = HUGE_HEADER) -> Path:
    """A file that really is ``8 + header_len`` bytes long (sparse: no disk or memory used)."""
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", header_len))
        handle.truncate(8 + header_len)
    return path


def config(**fields: object) -> dict[str, object]:
    return {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], **fields}


def targeted(pattern: str, base: BaseModelSpec) -> set[str]:
    lora = parse_adapter_config(config(target_modules=pattern))
    return {
        BaseModelSpec.module_path(layer, module)
        for layer in range(base.num_layers)
        for module in TARGET_MODULES
        if lora.targets(layer, module)
    }


def test_a_huge_header_length_is_refused_on_its_prefix_alone(tmp_path: Path) -> None:
    path = sparse_weights(tmp_path / "adapter_model.safetensors")
    reader = CountingReader(path)
    with pytest.raises(CorruptArtifactError, match=f"cap {MAX_HEADER_BYTES}"):
        parse_safetensors_header(reader, path, path.stat().st_size)
    assert reader.bytes_read == 8
    assert MAX_HEADER_BYTES <= 1 << 20


def test_adapter_validation_reads_only_the_prefix_of_a_huge_header(
    tmp_path: Path, base: BaseModelSpec, builder, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    adapter_dir = builder.write()
    sparse_weights(adapter_dir / "adapter_model.safetensors")
    readers: list[CountingHashingReader] = []

    class CountingHashingReader(HashingReader):
        def __init__(self, handle) -> None:  # type: ignore[no-untyped-def]
            super().__init__(handle)
            self.bytes_read = 0
            readers.append(self)

        def read(self, size: int, /) -> bytes:
            data = super().read(size)
            self.bytes_read += len(data)
            return data

    monkeypatch.setattr(validate, "HashingReader", CountingHashingReader)
    with pytest.raises(CorruptArtifactError, match=f"header length {HUGE_HEADER}"):
        validate.validate_adapter_dir(adapter_dir, base, 8)
    assert [r.bytes_read for r in readers] == [8]


def test_a_real_sized_header_still_passes(base: BaseModelSpec, builder) -> None:  # type: ignore[no-untyped-def]
    metadata = {"format": "pt", "notes": "x" * 50_000}  # tens of KiB, as training tools write
    adapter_dir = builder.write()
    weights = adapter_dir / "adapter_model.safetensors"
    raw = weights.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    header["__metadata__"] = metadata
    encoded = json.dumps(header).encode()
    weights.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + header_len :])
    validated = validate.validate_adapter_dir(adapter_dir, base, 8)
    assert validated.tensors


def test_a_catastrophic_target_regex_is_matched_in_linear_time(base: BaseModelSpec) -> None:
    # With ``re``, the first branch backtracks through 2^30 ways to split a 31-character path
    # before the second branch is tried: minutes per module path, every other thread stalled.
    pattern = r"([\w.]+)+X|.*\.q_proj"
    assert targeted(pattern, base) == {
        BaseModelSpec.module_path(layer, "q_proj") for layer in range(base.num_layers)
    }


def test_catastrophic_pattern_keys_and_excludes_are_matched_in_linear_time(
    base: BaseModelSpec,
) -> None:
    lora = parse_adapter_config(
        config(
            target_modules=["q_proj", "v_proj"],
            rank_pattern={r"([\w.]+)+X": 2, "v_proj": 6},
            exclude_modules=r"([\w.]+)+X|.*layers\.1\..*",
        )
    )
    assert [lora.targets(0, "q_proj"), lora.targets(1, "q_proj")] == [True, False]
    assert (lora.rank_for(0, "q_proj"), lora.rank_for(0, "v_proj")) == (4, 6)


@pytest.mark.parametrize(
    ("field", "pattern"),
    [
        ("target_modules", r".*\.(q)_proj|.*(v)_\2proj"),  # backreference
        ("target_modules", r".*(?<=self_attn\.)q_proj"),  # lookbehind
        ("target_modules", r".*\.q_proj(?!x)"),  # lookahead
        ("exclude_modules", r"(.*)\.\1"),  # backreference
        ("target_modules", r".*\.q_proj\Z"),  # Python-only end anchor
        ("target_modules", r".*\.q_pro(?>j)"),  # atomic group
    ],
)
def test_patterns_re2_cannot_match_linearly_are_refused_naming_the_field(
    field: str, pattern: str
) -> None:
    re.compile(pattern)  # Python's re (and so PEFT) would accept and backtrack through it
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config(config(**{field: pattern}))
    assert info.value.field == field
    assert info.value.value == pattern
    assert "linear time" in info.value.expected
    assert repr(field) in str(info.value)


def test_a_backreference_in_a_pattern_key_is_refused_naming_the_field() -> None:
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config(config(rank_pattern={r"(q)_\1": 2}))
    assert (info.value.field, info.value.value) == ("rank_pattern", r"(q)_\1")


def test_pattern_length_is_capped() -> None:
    alternatives = "|".join(f"model\\.layers\\.{i}\\.self_attn\\.q_proj" for i in range(40))
    assert len(alternatives) > MAX_PATTERN_CHARS
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config(config(target_modules=alternatives))
    assert info.value.field == "target_modules"
    assert f"at most {MAX_PATTERN_CHARS} characters" in info.value.expected
    assert len(str(info.value)) < 400  # the message quotes a bounded prefix of the pattern


def test_compiled_program_size_is_capped() -> None:
    pattern = r".{0,1000}\.q_proj"  # 17 characters, ~9000 RE2 instructions
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config(config(target_modules=pattern))
    assert info.value.field == "target_modules"
    assert f"at most {MAX_PROGRAM_SIZE} RE2 instructions" in info.value.expected


def test_a_fields_patterns_together_are_capped() -> None:
    key = r"[a-z_.0-9]{0,300}"
    size = ConfigRegex("rank_pattern", key).program_size
    assert size <= MAX_PROGRAM_SIZE
    count = MAX_FIELD_PROGRAM_SIZE // size + 1
    assert count <= MAX_CONFIG_ENTRIES
    keys = {f"{key}x{i}": 2 for i in range(count)}
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config(config(rank_pattern=keys))
    assert info.value.field == "rank_pattern"
    assert f"at most {MAX_FIELD_PROGRAM_SIZE} RE2 instructions" in info.value.expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_modules", ["q_proj"] * (MAX_CONFIG_ENTRIES + 1)),
        ("exclude_modules", ["v_proj"] * (MAX_CONFIG_ENTRIES + 1)),
        ("layers_to_transform", [0] * (MAX_CONFIG_ENTRIES + 1)),
        ("layers_pattern", ["layers"] * (MAX_CONFIG_ENTRIES + 1)),
        ("rank_pattern", {f"x{i}": 2 for i in range(MAX_CONFIG_ENTRIES + 1)}),
        ("alpha_pattern", {f"x{i}": 2 for i in range(MAX_CONFIG_ENTRIES + 1)}),
    ],
)
def test_list_and_map_fields_hold_a_bounded_number_of_entries(field: str, value: object) -> None:
    with pytest.raises(AdapterConfigError) as info:
        parse_adapter_config(config(**{field: value}))
    assert info.value.field == field
    assert f"at most {MAX_CONFIG_ENTRIES} entries" in info.value.expected


def test_one_entry_per_module_of_a_large_model_still_fits(base: BaseModelSpec) -> None:
    ranks = {f"model.layers.{i}.self_attn.q_proj": 2 for i in range(126)}
    ranks |= {f"model.layers.{i}.mlp.down_proj": 3 for i in range(126)}
    lora = parse_adapter_config(config(target_modules=["q_proj", "down_proj"], rank_pattern=ranks))
    assert (lora.rank_for(1, "q_proj"), lora.rank_for(1, "down_proj")) == (2, 3)


# --- parity with PEFT's ``re`` calls on ordinary patterns ------------------------------------

FRAGMENTS = (
    r".*",
    r".*\.",
    r"model\.",
    r"layers\.",
    r"\d+",
    r"[0-9]",
    r"[13]",
    r"\.",
    r"self_attn\.",
    r"mlp\.",
    r"(self_attn|mlp)\.",
    r"(q|k|v)_proj",
    r"[a-z]+_proj",
    r"q_proj",
    r"down_proj",
    r"\w+",
    r"(?:up|gate)_proj",
    r"(\.\d+)?",
    r"_proj",
    r"^",
    r"$",
    r"[^.]+",
    r"\.?",
)
PATHS = [
    BaseModelSpec.module_path(layer, module)
    for layer in (0, 1, 3, 12, 31)
    for module in TARGET_MODULES
]


def _peft_layer_index(path: str, layers_pattern: str) -> int | None:
    match = re.match(rf"(?:^|.*?\.){layers_pattern}\.(?P<idx>\d+)\.", path)
    return None if match is None else int(match.group("idx"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=5))
def test_re2_matches_what_peft_re_matches_on_ordinary_patterns(parts: list[str]) -> None:
    pattern = "".join(parts)
    as_target = ConfigRegex("target_modules", pattern)
    as_key = ConfigRegex("rank_pattern", pattern, r"(.*\.)?({})$")
    for path in PATHS:
        # PEFT: match_target_against_key is re.fullmatch; get_pattern_key is this re.match.
        assert as_target.fullmatch(path) == (re.fullmatch(pattern, path) is not None), path
        assert as_key.match(path) == (re.match(rf"(.*\.)?({pattern})$", path) is not None), path


@pytest.mark.parametrize("name", ["layers", "model\\.layers", "lay.rs", "h", "(layers|blocks)"])
def test_layers_pattern_finds_the_index_peft_finds(name: str) -> None:
    regex = ConfigRegex("layers_pattern", name, r"(?:^|.*?\.){}\.(?P<idx>\d+)\.", groups=True)
    for path in PATHS:
        index = regex.match_group(path, "idx")
        assert (None if index is None else int(index)) == _peft_layer_index(path, name)
