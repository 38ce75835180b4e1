"""A separate deployment's model: the base model with one adapter merged into its weights by
PEFT's own ``merge_and_unload``, saved as a plain Hugging Face checkpoint directory.

Why PEFT and a dense checkpoint rather than ``loraplex serve --mode merged:<ref>``: a separate
deployment, as operators run one, is a dense model with no adapter machinery. loraplex's merged
mode keeps a host copy of every targeted weight row (to unmerge exactly), an adapter slot pool and
the adapter cache: memory and start-up work a dense replica does not have, which would price the
comparator above what it costs. PEFT is also the reference the merge is checked against, so the
dense model's answers are PEFT's, not loraplex's.

The merge imports torch, transformers and peft, so it runs in a subprocess; this module does not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Files of the base checkpoint a served model directory needs beside its weights.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_DONE = "merged-from.json"  # written last: a directory without it is incomplete
_MERGE = (
    "import json, sys\n"
    "from loraplex.qualify.baselines.dense import merge_into_dense\n"
    "for job in json.loads(sys.argv[1]):\n"
    "    merge_into_dense(*job)\n"
)


def dense_name(adapter_ref: str) -> str:
    """The merged model's directory name, which is also the name requests give for it."""
    return "merged-" + adapter_ref.replace("/", "-").replace("@", "-")


def merge_into_dense(base_dir: str, adapter_dir: str, out_dir: str) -> None:
    """PEFT: load ``base_dir``, apply ``adapter_dir``, ``merge_and_unload``, save to
    ``out_dir`` (safetensors) with the base's tokenizer. Runs in the merge subprocess."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    staging = Path(out_dir + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    merged.save_pretrained(staging, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        if (Path(base_dir) / name).exists():
            shutil.copy2(Path(base_dir) / name, staging / name)
    record = {"base": base_dir, "adapter": adapter_dir, "method": "peft merge_and_unload"}
    (staging / _DONE).write_text(json.dumps(record), encoding="utf-8")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(staging, out_dir)


def merged_models(base_dir: Path, adapters: dict[str, Path], root: Path) -> dict[str, Path]:
    """adapter ref -> a dense checkpoint of ``base_dir`` with that adapter merged, under
    ``root``; the ones already complete there are reused, the rest merged in one subprocess.
    RuntimeError quoting the subprocess's output when it fails."""
    out = {ref: root / dense_name(ref) for ref in adapters}
    jobs = [
        [str(base_dir), str(adapters[ref]), str(path)]
        for ref, path in out.items()
        if not (path / _DONE).exists()
    ]
    if jobs:
        root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run(
            [sys.executable, "-c", _MERGE, json.dumps(jobs)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"PEFT merge failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return out
