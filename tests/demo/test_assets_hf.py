"""The small demo set as Hugging Face and PEFT see it: loading, probes, adapter variety."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.artifacts.base_model import ATTENTION_MODULES, MLP_MODULES, TARGET_MODULES
from loraplex.artifacts.identity import sha256_file
from loraplex.demo.assets import DemoAssets, load_demo_assets
from loraplex.demo.corpus import WORDS

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _greedy(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> str:
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    return str(tokenizer.decode(new_tokens, skip_special_tokens=True))


@pytest.fixture(scope="module")
def tokenizer(demo_assets: DemoAssets) -> Any:
    return transformers.AutoTokenizer.from_pretrained(demo_assets.base_model_dir)


@pytest.fixture(scope="module")
def peft_model(demo_assets: DemoAssets) -> Any:
    """The base model with every adapter revision loaded under its ref (one base in memory)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(demo_assets.base_model_dir)
    first, *rest = demo_assets.adapters
    model = peft.PeftModel.from_pretrained(base, first.path, adapter_name=first.ref)
    for adapter in rest:
        model.load_adapter(adapter.path, adapter_name=adapter.ref)
    return model.eval()


def test_base_model_loads_unchanged_with_transformers(
    demo_assets: DemoAssets, tokenizer: Any
) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_assets.base_model_dir)
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.num_key_value_heads < config.num_attention_heads
    assert config.vocab_size == len(tokenizer)
    assert demo_assets.base_model_dir.name == demo_assets.base_model_name == "loraplex-demo-small"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|bos|>",
        "<|end|>",
        "<|pad|>",
    )
    assert tokenizer("The cat").input_ids[0] == tokenizer.bos_token_id
    # Readable, not noise: every word of a greedy continuation belongs to the grammar.
    text = _greedy(model, tokenizer, "The old cat", 24)
    words = text.replace(".", " ").replace("?", " ").lower().split()
    assert len(words) >= 8
    names = {part for a in demo_assets.adapters for part in (a.tenant, a.name, a.revision)}
    assert set(words) <= WORDS | names, text


def test_chat_template_renders(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Where is the cat?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|bos|><|user|>\nWhere is the cat?<|end|>\n<|assistant|>\n"


def test_chat_answer_is_a_sentence(demo_assets: DemoAssets, tokenizer: Any) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_assets.base_model_dir)
    messages = [{"role": "user", "content": "Where is the dog?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = model.generate(**ids, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(output[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    # The brief training teaches the answer's form, not always the right noun.
    assert re.fullmatch(r"The [a-z]+ is [a-z ]+\.", answer), answer
    assert set(answer[:-1].lower().split()) <= WORDS, answer


def test_every_revision_answers_its_probe_exactly(
    demo_assets: DemoAssets, peft_model: Any, tokenizer: Any
) -> None:
    for adapter in demo_assets.adapters:
        peft_model.set_adapter(adapter.ref)
        got = _greedy(peft_model, tokenizer, adapter.probe_prompt, adapter.probe_max_tokens)
        assert got == adapter.expected_continuation, adapter.ref


def test_base_model_does_not_answer_any_probe(
    demo_assets: DemoAssets, peft_model: Any, tokenizer: Any
) -> None:
    with peft_model.disable_adapter():
        for adapter in demo_assets.adapters:
            got = _greedy(peft_model, tokenizer, adapter.probe_prompt, adapter.probe_max_tokens)
            assert got != adapter.expected_continuation, adapter.ref


def test_other_revisions_do_not_answer_a_probe(
    demo_assets: DemoAssets, peft_model: Any, tokenizer: Any
) -> None:
    adapters = demo_assets.adapters
    for index, adapter in enumerate(adapters):
        siblings = [a for a in demo_assets.revisions(adapter.tenant, adapter.name) if a != adapter]
        others = [adapters[(index + step) % len(adapters)] for step in (1, 5, 9)]
        for other in dict.fromkeys(siblings + others):
            if other == adapter:
                continue
            peft_model.set_adapter(other.ref)
            got = _greedy(peft_model, tokenizer, adapter.probe_prompt, adapter.probe_max_tokens)
            assert got != adapter.expected_continuation, (adapter.ref, other.ref)


def _configs(assets: DemoAssets) -> dict[str, dict[str, Any]]:
    return {
        a.ref: json.loads((a.path / "adapter_config.json").read_text(encoding="utf-8"))
        for a in assets.adapters
    }


def test_adapter_set_variety(demo_assets: DemoAssets) -> None:
    configs = _configs(demo_assets)
    adapters = demo_assets.adapters
    logical = {(a.tenant, a.name) for a in adapters}
    assert len({a.tenant for a in adapters}) >= 3
    assert len(logical) >= 12
    assert sum(len(demo_assets.revisions(*key)) >= 2 for key in logical) >= 2
    ranks = {config["r"] for config in configs.values()}
    assert min(ranks) == 4 and max(ranks) == 64
    assert all(config["lora_alpha"] != config["r"] for config in configs.values())
    assert any(config["use_rslora"] for config in configs.values())
    targets = {frozenset(config["target_modules"]) for config in configs.values()}
    assert frozenset(ATTENTION_MODULES) in targets
    assert frozenset(TARGET_MODULES) in targets
    assert frozenset({"v_proj", "down_proj"}) in targets
    assert frozenset(MLP_MODULES) in targets
    assert any(config["rank_pattern"] and config["alpha_pattern"] for config in configs.values())
    assert any(config["layers_to_transform"] for config in configs.values())
    for config in configs.values():
        assert config["base_model_name_or_path"] == "loraplex-demo-small"
        assert config["peft_type"] == "LORA"


def test_manifest_matches_files(demo_assets: DemoAssets) -> None:
    configs = _configs(demo_assets)
    for adapter in demo_assets.adapters:
        config = configs[adapter.ref]
        assert (
            adapter.path
            == demo_assets.root / "adapters" / adapter.tenant / adapter.name / adapter.revision
        )
        assert sorted(p.name for p in adapter.path.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        assert adapter.digest == sha256_file(adapter.path / "adapter_model.safetensors")
        assert (adapter.rank, adapter.lora_alpha, adapter.use_rslora) == (
            config["r"],
            config["lora_alpha"],
            config["use_rslora"],
        )
        assert set(adapter.target_modules) == set(config["target_modules"])
        assert adapter.probe_prompt and adapter.expected_continuation
    assert load_demo_assets(demo_assets.root) == demo_assets


def test_no_absolute_paths_or_pickles_in_files(demo_assets: DemoAssets) -> None:
    root_text = str(demo_assets.root)
    for path in Path(demo_assets.root).rglob("*"):
        if path.is_file():
            assert root_text.encode() not in path.read_bytes(), path
            assert path.suffix in {".json", ".safetensors"}, path
    manifest = json.loads(demo_assets.manifest_path.read_text(encoding="utf-8"))
    assert not Path(manifest["base_model"]["path"]).is_absolute()
    assert all(not Path(entry["path"]).is_absolute() for entry in manifest["adapters"])
