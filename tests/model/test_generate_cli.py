"""``loraplex generate`` end to end on a tiny model with a word tokenizer (through the engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import hf_model, save_tiny_model, save_word_tokenizer
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.demo.assets import DemoAssets
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.sampling import SamplingParams


@pytest.fixture(scope="module")
def model_and_adapter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("cli")
    base = save_tiny_model(root / "tiny-cli", "llama")
    save_word_tokenizer(base)
    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(hf_model(base), config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(10.0)
    peft_model.save_pretrained(root / "adapter")
    return base, root / "adapter"


def test_json_output_matches_the_python_api(model_and_adapter: tuple[Path, Path]) -> None:
    base, adapter = model_and_adapter
    args = ["generate", "--model", str(base), "--prompt", "w5 w6", "--prompt", "w7",
            "--adapter", str(adapter), "--adapter", "none",
            "--max-tokens", "5", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    with OfflineEngine(base) as engine:
        want = engine.generate(
            [
                OfflineRequest("w5 w6", adapter, SamplingParams(5)),
                OfflineRequest("w7", None, SamplingParams(5)),
            ]
        )
    assert [r["adapter"] for r in records] == [str(adapter), None]
    assert [r["token_ids"] for r in records] == [list(w.token_ids) for w in want]
    assert [r["text"] for r in records] == [w.text for w in want]
    assert records[0]["finish_reason"] == "length" and records[0]["prompt_tokens"] == 3


def test_plain_output_and_errors(model_and_adapter: tuple[Path, Path]) -> None:
    base, adapter = model_and_adapter
    runner = CliRunner()
    ok = runner.invoke(
        app, ["generate", "--model", str(base), "--prompt", "w9", "--max-tokens", "3"]
    )
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("[none] (length) 'w9' -> 'w")
    mismatched = ["generate", "--model", str(base), "--prompt", "a", "--prompt", "b",
                  "--prompt", "c", "--adapter", str(adapter), "--adapter", "none"]  # fmt: skip
    assert runner.invoke(app, mismatched).exit_code == 2
    bad = runner.invoke(app, ["generate", "--model", str(base), "--prompt", "w9", "--top-p", "0"])
    assert bad.exit_code == 1 and "top_p" in bad.stderr
    missing = runner.invoke(app, ["generate", "--model", str(adapter), "--prompt", "w9"])
    assert missing.exit_code == 1 and "config.json" in missing.stderr


def test_float16_generates_on_the_cpu(demo_assets: DemoAssets) -> None:
    """``--dtype float16`` was refused off CUDA ("dtype float16 is invalid on CPU") although the
    CPU path runs it, as ``serve`` does: it gives tokens, and logprobs close to float32's."""
    base = demo_assets.base_model_dir
    args = ["generate", "--model", str(base), "--prompt", "Hi", "--max-tokens", "4",
            "--dtype", "float16", "--device", "cpu", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token_ids"]
    firsts = []
    for dtype in ("float32", "float16"):
        with OfflineEngine(base, OfflineConfig(dtype=dtype, device="cpu")) as engine:
            done = engine.generate([OfflineRequest("Hi", None, SamplingParams(1, logprobs=3))])
        logprobs = done[0].logprobs
        assert logprobs is not None
        firsts.append(dict(logprobs[0].top))
    assert firsts[0].keys() == firsts[1].keys()  # the same top 3 (their order is a near-tie here)
    assert all(abs(firsts[0][t] - firsts[1][t]) < 0.05 for t in firsts[0])
