"""Real clients, unchanged, against the assembled server (real engine, demo set): GuideLLM's
Poisson load on both endpoints and lm-eval's ``local-completions`` loglikelihoods.

Each runs as its users run it, in a subprocess (lm-eval's command line with the test's task
alone in its task index), offline: the demo model's local tokenizer, a synthetic GuideLLM
dataset and an lm-eval task whose JSON dataset the test writes. Nothing is downloaded
(``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``; the Hugging Face cache is the test's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live import Live, live_server
from tokenizers import Tokenizer

from loraplex.demo.assets import DemoAssets
from loraplex.engine.offline import OfflineConfig, OfflineEngine, OfflineRequest
from loraplex.sampling import SamplingParams
from loraplex.server.chat import ChatMessage

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT_S = 240  # one client run (each takes ~10 s here; CI machines are slower)
NUM_REQUESTS = 12  # per GuideLLM run
OUTPUT_TOKENS = 8  # GuideLLM asks exactly this many (ignore_eos)
TOL = 1e-4  # lm-eval's loglikelihood against the engine's own (float32)
MODEL = "support"  # acme's alias of acme/support@r1


@pytest.fixture(scope="module")
def live(demo_assets: DemoAssets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("clients")
    with live_server(demo_assets, data_dir, max_loras=4, max_num_seqs=16) as server:
        yield server


def _offline_env(tmp_path: Path, key: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OPENAI_API_KEY": key,  # lm-eval's local-completions reads it
        "GUIDELLM__MAX_WORKER_PROCESSES": "1",  # each worker is a spawned interpreter
    }


def _run(command: list[str], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(
        command,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{command[:3]} exited {done.returncode}:\n{done.stderr[-4000:]}"


def _flat(options: dict[str, str]) -> list[str]:
    return [part for option, value in options.items() for part in (option, value)]


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _generated_tokens(live: Live) -> float:
    """The server's own count of generated tokens, every priority class together."""
    registry = live.server.deps.metrics.registry
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "generated_tokens"
        for sample in family.samples
        if sample.name == "generated_tokens_total"
    )


def _server_prompt_tokens(live: Live, body: dict[str, Any]) -> int:
    """What the server counts as the prompt of ``body`` (its tokenizer, its chat template)."""
    deps = live.server.deps
    if "prompt" in body:
        return len(deps.engine.tokenizer.encode(body["prompt"]))
    assert deps.chat is not None
    messages = [
        ChatMessage(m["role"], "".join(part["text"] for part in m["content"]))
        if isinstance(m["content"], list)
        else ChatMessage(m["role"], m["content"])
        for m in body["messages"]
    ]
    return len(deps.chat.encode(messages, deps.engine.tokenizer))


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_poisson_run_has_no_errors_and_the_servers_token_counts(
    live: Live, tmp_path: Path, endpoint: str
) -> None:
    """GuideLLM streams with ``continuous_usage_stats`` (a 400 here before) and takes its
    token counts from the server's usage: they must be the server's own."""
    before = _generated_tokens(live)
    report = tmp_path / "guidellm.json"
    backend = (
        f"kind=openai_http,target={live.url},model={MODEL},api_key={live.key('acme')},"
        f"request_format={endpoint}"
    )
    options = {
        "--backend": backend,
        "--profile": "kind=poisson,rate=8",
        "--constraint": f"kind=max_requests,count={NUM_REQUESTS}",
        "--tokenizer": f"kind=huggingface_auto,model={live.assets.base_model_dir}",
        "--data": f"kind=synthetic_text,prompt_tokens=16,output_tokens={OUTPUT_TOKENS}",
        "--output": f"kind=json,path={report}",
    }
    _run(
        [_bin("guidellm"), "run", *_flat(options), "--disable-console"],
        _offline_env(tmp_path, live.key("acme")),
        tmp_path,
    )
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    requests = benchmark["requests"]
    assert not requests["errored"] and not requests["incomplete"]
    assert len(requests["successful"]) == NUM_REQUESTS
    for done in requests["successful"]:
        body = json.loads(done["request_args"])["body"]
        assert body["stream"] and body["stream_options"]["continuous_usage_stats"]
        assert done["input_metrics"]["text_tokens"] == _server_prompt_tokens(live, body)
        assert done["output_metrics"]["text_tokens"] == OUTPUT_TOKENS
    assert _generated_tokens(live) - before == NUM_REQUESTS * OUTPUT_TOKENS


# Contexts and continuations of a multiple-choice task: lm-eval scores each continuation by its
# loglikelihood (``echo`` + ``logprobs`` + ``max_tokens`` 1, the prompt's logprobs).
DOCS = [
    {
        "context": "The acme support team",
        "choices": [" is acme support r1", " answers"],
        "label": 0,
    },
    {"context": "My letter is", "choices": [" bright and busy", " warm", " a boat"], "label": 1},
    {"context": "Where is the", "choices": [" boat", " round letter"], "label": 0},
]
TASK = """task: loraplex_smoke
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


# lm-eval's own command line (its ``lm_eval`` script's entry point), except that its task index
# holds the test's task alone: the built-in index parses about 14,000 YAML files on every start
# (6 s of CPU, and 16 s of wall time on a loaded 2-core machine) for tasks never run here.
LM_EVAL_OWN_TASKS_ONLY = """
import sys
from lm_eval.__main__ import cli_evaluate
from lm_eval.tasks.manager import TaskManager
index_all = TaskManager.__init__
def index_own(self, *args, **kwargs):
    index_all(self, *args, **{**kwargs, "include_defaults": False})
TaskManager.__init__ = index_own
sys.exit(cli_evaluate())
"""


def _lm_eval_loglikelihoods(live: Live, tmp_path: Path) -> dict[tuple[str, str], float]:
    """(context, continuation) -> the loglikelihood lm-eval computed from the server's answer."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tasks / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tasks / "loraplex_smoke.yaml").write_text(TASK.format(data=data))
    model_args = (
        f"model={MODEL},base_url={live.url}/v1/completions,tokenizer_backend=huggingface,"
        f"tokenizer={live.assets.base_model_dir},num_concurrent=2,max_retries=1"
    )
    options = {
        "--model": "local-completions",
        "--model_args": model_args,
        "--tasks": "loraplex_smoke",
        "--include_path": str(tasks),
        "--output_path": str(tmp_path / "out"),
    }
    _run(
        [sys.executable, "-c", LM_EVAL_OWN_TASKS_ONLY, *_flat(options), "--log_samples"],
        _offline_env(tmp_path, live.key("acme")),
        tmp_path,
    )
    (samples,) = (tmp_path / "out").rglob("samples_loraplex_smoke_*.jsonl")
    scores = {}
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        # One request per choice: its (context, continuation) and [[loglikelihood, greedy]],
        # logged as strings (Python's repr of the float, so exact).
        for request, [[loglikelihood, _greedy]] in zip(
            sample["arguments"].values(), sample["resps"], strict=True
        ):
            scores[(request["arg_0"], request["arg_1"])] = float(loglikelihood)
    return scores


def test_lm_eval_local_completions_loglikelihoods_equal_the_engines(
    live: Live, tmp_path: Path
) -> None:
    scores = _lm_eval_loglikelihoods(live, tmp_path)
    assert len(scores) == sum(len(doc["choices"]) for doc in DOCS)
    # The engine's own: the same token ids (lm-eval's split: context, then the rest of the
    # whole text; no special tokens) through an offline engine, prompt logprobs summed.
    tokenizer = Tokenizer.from_file(str(live.assets.base_model_dir / "tokenizer.json"))
    adapter = live.assets.adapter("acme", "support", "r1")
    pairs = list(scores)
    ids = []
    for context, continuation in pairs:
        whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
        ids.append((len(tokenizer.encode(context, add_special_tokens=False).ids), tuple(whole)))
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    with OfflineEngine(live.assets.base_model_dir, OfflineConfig()) as engine:
        results = engine.generate([OfflineRequest(i, adapter.path, params) for _, i in ids])
    for pair, (num_context, _), result in zip(pairs, ids, results, strict=True):
        assert result.prompt_logprobs is not None
        own = sum(e.logprob for e in result.prompt_logprobs[num_context:] if e is not None)
        assert scores[pair] == pytest.approx(own, abs=TOL), pair
