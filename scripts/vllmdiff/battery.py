"""The requests ``vllmdiff`` sends to both servers. ``@tenant/name/revision`` and ``@base`` are
mapped to each server's model name (``vllmdiff.model_names``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BASE_NAME = "loraplex-demo-small"  # the demo model's directory name; vLLM's --served-model-name
SUPPORT = "@acme/support/r1"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
PROMPT = "The acme support team"
USER = [{"role": "user", "content": "The acme support team"}]
LONG_PROMPT = " ".join(["team"] * 600)  # one token per word: past the 512-token context


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: Any  # a JSON body, a raw string, or None
    method: str = "POST"
    errors_only: bool = False  # an error expected: its message wording is not compared
    auth: bool = True
    note: str = ""


def cmpl(name: str, **fields: Any) -> Case:
    return Case(name, CMPL, {"model": SUPPORT, "prompt": PROMPT, "temperature": 0, **fields})


def chat(name: str, **fields: Any) -> Case:
    return Case(name, CHAT, {"model": SUPPORT, "messages": USER, "temperature": 0, **fields})


def bad(name: str, path: str, **fields: Any) -> Case:
    base: dict[str, Any] = {"model": SUPPORT, "temperature": 0, "max_tokens": 4}
    base.update({"prompt": PROMPT} if path == CMPL else {"messages": USER})
    base.update(fields)
    return Case(name, path, {k: v for k, v in base.items() if v is not DROP}, errors_only=True)


DROP = object()  # a field the bad request leaves out
# Every demo adapter revision with its probe prompt (the demo manifest's), for greedy parity.
ADAPTERS = (
    ("acme/support/r1", "The acme support team"),
    ("acme/support/r2", "The acme support team"),
    ("acme/billing/r1", "The acme billing team"),
    ("acme/legal/r1", "The acme legal team"),
    ("acme/triage/r1", "The acme triage team"),
    ("globex/search/r1", "The globex search team"),
    ("globex/search/r2", "The globex search team"),
    ("globex/search/r3", "The globex search team"),
    ("globex/summarize/r1", "The globex summarize team"),
    ("globex/translate/r1", "The globex translate team"),
    ("globex/codegen/r1", "The globex codegen team"),
    ("initech/chat/r1", "The initech chat team"),
    ("initech/classify/r1", "The initech classify team"),
    ("initech/extract/r1", "The initech extract team"),
    ("initech/review/r1", "The initech review team"),
    ("initech/review/r2", "The initech review team"),
)
SAMPLED = {"temperature": 1.0, "seed": 7}  # n > 1 (vLLM refuses n > 1 with greedy sampling)
USAGE = {"stream": True, "stream_options": {"include_usage": True}}

CASES: tuple[Case, ...] = (
    Case("models", "/v1/models", None, method="GET"),
    *(
        cmpl(
            f"greedy-{ref}",
            model=f"@{ref}",
            prompt=prompt,
            max_tokens=24,
            logprobs=2,
            ignore_eos=True,
        )
        for ref, prompt in ADAPTERS
    ),
    *(
        chat(
            f"greedy-chat-{ref}",
            model=f"@{ref}",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            logprobs=True,
            top_logprobs=2,
        )
        for ref, prompt in ADAPTERS[::5]
    ),
    cmpl("cmpl-base", model="@base", max_tokens=16),
    cmpl("cmpl-length", max_tokens=3),
    cmpl("cmpl-stop", max_tokens=12, stop=[" and"]),
    cmpl("cmpl-stop-token", max_tokens=12, stop_token_ids=[2]),
    cmpl("cmpl-logprobs", max_tokens=6, logprobs=3),
    cmpl("cmpl-logprobs0", max_tokens=4, logprobs=0),
    cmpl("cmpl-echo", max_tokens=4, echo=True),
    cmpl("cmpl-echo-logprobs", max_tokens=4, echo=True, logprobs=2),
    cmpl("cmpl-echo-max0", max_tokens=0, echo=True, logprobs=1),
    cmpl("cmpl-token-prompt", prompt=[1, 55, 66, 77], max_tokens=6),
    cmpl("cmpl-prompts", prompt=[PROMPT, "The acme legal team"], max_tokens=6),
    cmpl("cmpl-repetition-penalty", max_tokens=24, repetition_penalty=1.3, logprobs=1),
    cmpl(
        "cmpl-presence-frequency",
        max_tokens=24,
        presence_penalty=1.0,
        frequency_penalty=0.5,
        logprobs=1,
    ),
    cmpl("cmpl-logit-bias", max_tokens=12, logit_bias={"486": -100, "315": 5}, logprobs=1),
    cmpl("cmpl-min-tokens", max_tokens=20, min_tokens=15, logprobs=1),
    cmpl("cmpl-top-k-1", max_tokens=8, temperature=1.0, top_k=1, seed=3),
    cmpl("cmpl-stop-logprobs", max_tokens=12, stop=[" and"], logprobs=1),
    cmpl("cmpl-include-stop", max_tokens=12, stop=[" and"], include_stop_str_in_output=True),
    cmpl(
        "cmpl-prompts-echo-logprobs",
        prompt=[PROMPT, [1, 55, 66]],
        max_tokens=2,
        echo=True,
        logprobs=1,
    ),
    cmpl("cmpl-n2", max_tokens=5, n=2, **SAMPLED),
    cmpl("cmpl-prompts-n2", prompt=[PROMPT, "The acme legal team"], max_tokens=3, n=2, **SAMPLED),
    cmpl("cmpl-stream", max_tokens=5, stream=True),
    cmpl("cmpl-stream-usage", max_tokens=5, **USAGE),
    cmpl("cmpl-stream-n2-usage", max_tokens=3, n=2, **SAMPLED, **USAGE),
    cmpl("cmpl-stream-logprobs", max_tokens=4, logprobs=2, stream=True),
    cmpl("cmpl-stream-echo", max_tokens=3, echo=True, stream=True),
    cmpl("cmpl-stream-stop", max_tokens=12, stop=[" and"], stream=True),
    cmpl(
        "cmpl-stream-continuous",
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    ),
    chat("chat-adapter", max_tokens=12),
    chat("chat-base", model="@base", max_tokens=12),
    chat("chat-max-completion-tokens", max_completion_tokens=5),
    chat("chat-default-max"),
    chat("chat-logprobs", max_tokens=4, logprobs=True, top_logprobs=2),
    chat("chat-logprobs-no-top", max_tokens=3, logprobs=True),
    chat("chat-n2", max_tokens=4, n=2, **SAMPLED),
    chat("chat-stop", max_tokens=12, stop=[" and"]),
    chat("chat-stream", max_tokens=4, stream=True),
    chat("chat-stream-usage", max_tokens=4, **USAGE),
    chat("chat-stream-n2-usage", max_tokens=3, n=2, **SAMPLED, **USAGE),
    chat("chat-stream-logprobs", max_tokens=3, stream=True, logprobs=True, top_logprobs=1),
    chat(
        "chat-stream-continuous",
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    ),
    chat("chat-system", messages=[{"role": "system", "content": "be brief"}, *USER], max_tokens=8),
    chat(
        "chat-multi-turn",
        max_tokens=8,
        messages=[
            *USER,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again"},
        ],
    ),
    chat("chat-repetition-penalty", max_tokens=16, repetition_penalty=1.3),
    Case("models-one", "/v1/models/loraplex-demo-small", None, method="GET"),
    # errors
    bad("err-unknown-model-stream", CMPL, model="no-such-model", stream=True),
    bad("err-max-tokens-both", CHAT, max_tokens=4, max_completion_tokens=5),
    bad("err-unknown-model", CMPL, model="no-such-model"),
    bad("err-unknown-model-chat", CHAT, model="no-such-model"),
    bad("err-temperature-negative", CMPL, temperature=-1),
    bad("err-temperature-3", CMPL, temperature=3),
    bad("err-top-p-0", CMPL, top_p=0),
    bad("err-max-tokens-large", CMPL, max_tokens=100000),
    bad("err-max-tokens-large-chat", CHAT, max_tokens=100000),
    bad("err-max-tokens-negative", CMPL, max_tokens=-1),
    bad("err-max-tokens-zero", CMPL, max_tokens=0),
    bad("err-prompt-too-long", CMPL, prompt=LONG_PROMPT),
    bad("err-prompt-too-long-chat", CHAT, messages=[{"role": "user", "content": LONG_PROMPT}]),
    bad("err-logit-bias-id", CMPL, logit_bias={"99999": 1}),
    bad("err-logit-bias-value", CMPL, logit_bias={"5": 500}),
    bad("err-logit-bias-key", CMPL, logit_bias={"abc": 1}),
    bad("err-n-greedy", CMPL, n=2),
    bad("err-n-17", CMPL, n=17, temperature=1.0),
    bad("err-n-0", CMPL, n=0),
    bad("err-empty-prompt", CMPL, prompt=""),
    bad("err-empty-prompt-list", CMPL, prompt=[]),
    bad("err-empty-messages", CHAT, messages=[]),
    bad("err-stop-5", CMPL, stop=["a", "b", "c", "d", "e"]),
    bad("err-logprobs-30", CMPL, logprobs=30),
    bad("err-top-logprobs-30", CHAT, logprobs=True, top_logprobs=30),
    bad("err-top-logprobs-alone", CHAT, top_logprobs=2),
    bad("err-unknown-field", CMPL, foo=1),
    bad("err-unknown-field-chat", CHAT, foo=1),
    bad("err-return-token-ids", CMPL, return_token_ids=True),
    bad("err-temperature-string", CMPL, temperature="0.5"),
    bad("err-stream-options-no-stream", CMPL, stream_options={"include_usage": True}),
    bad("err-missing-model", CMPL, model=DROP),
    bad("err-missing-prompt", CMPL, prompt=DROP),
    bad("err-suffix", CMPL, suffix="x"),
    bad("err-response-format", CHAT, response_format={"type": "json_object"}),
    bad("err-tools", CHAT, tools=[{"type": "function", "function": {"name": "f"}}]),
    bad("err-role", CHAT, messages=[{"role": "robot", "content": "hi"}]),
    Case("err-bad-json", CMPL, "{not json", errors_only=True),
    Case("err-no-key", CMPL, {"model": SUPPORT, "prompt": PROMPT}, errors_only=True, auth=False),
    Case("err-get-completions", CMPL, None, method="GET", errors_only=True),
)
