#!/usr/bin/env python3
"""Every less-used request field, alone and in combinations: does it work, or is it refused by
name?

Against one ``loraplex serve`` (the demo set; the hostile tenant's key): each case sends one
body to ``/v1/completions``, ``/v1/chat/completions`` or ``/tokenize`` and states what must
happen: ``refuse FIELD`` (a 400 whose ``error.param`` is FIELD, or whose message names it) or
``work`` with a check of the answer (the field's effect is visible). Non-standard JSON numbers
(``NaN``, ``Infinity``) are sent raw, as Python's parser reads them. Prints one JSON line: the
count of cases, the statuses, and every case whose outcome was not the expected one:

    scripts/attacks/attack25/field-matrix.py --url http://127.0.0.1:18251 --key "$ACME"
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

ADAPTER = "support"
BASE = "loraplex-demo-small"
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
Check = Callable[[dict[str, Any]], str | None]  # None: the effect is there; else what is wrong


def msgs(text: str = "hello") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def comp(**extra: Any) -> dict[str, Any]:
    return {"model": ADAPTER, "prompt": "The acme support team", "max_tokens": 4} | extra


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": ADAPTER, "messages": msgs(), "max_tokens": 4} | extra


def n_choices(k: int) -> Check:
    return lambda a: None if len(a.get("choices", [])) == k else f"{len(a['choices'])} choices"


def all_token(token_text: str) -> Check:
    def check(a: dict[str, Any]) -> str | None:
        lp = a["choices"][0].get("logprobs") or {}
        tokens = lp.get("tokens") or [c["token"] for c in (lp.get("content") or [])]
        return None if tokens and all(t == token_text for t in tokens) else f"tokens {tokens}"

    return check


def top_size(k: int) -> Check:
    def check(a: dict[str, Any]) -> str | None:
        content = a["choices"][0]["logprobs"]["content"]
        sizes = {len(c["top_logprobs"]) for c in content}
        return None if sizes == {k} else f"top sizes {sizes}"

    return check


def echoed(prompt: str) -> Check:
    return lambda a: (
        None if a["choices"][0]["text"].startswith(prompt) else repr(a["choices"][0]["text"])
    )


def usage_chunks(raw: str) -> str | None:
    chunks = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
    with_usage = [c for c in chunks if c.get("usage")]
    return None if len(with_usage) == len(chunks) else f"{len(with_usage)}/{len(chunks)} usage"


# (name, path, body or raw text, expectation): "refuse:FIELD" or "work" with its check.
def cases() -> list[tuple[str, str, Any, str, Check | None]]:
    lb300 = {str(i): 0.5 for i in range(300)}
    lb301 = {str(i): 0.5 for i in range(301)}
    c: list[tuple[str, str, Any, str, Check | None]] = [
        ("suffix empty", COMP, comp(suffix=""), "work", None),
        ("suffix text", COMP, comp(suffix=" end"), "refuse:suffix", None),
        ("logit_bias 300", COMP, comp(logit_bias=lb300), "work", None),
        ("logit_bias 301", COMP, comp(logit_bias=lb301), "refuse:logit_bias", None),
        (
            "logit_bias 5 and 05",
            COMP,
            comp(logit_bias={"5": 1, "05": 2}),
            "refuse:logit_bias",
            None,
        ),
        ("logit_bias arabic 3", COMP, comp(logit_bias={"\u0663": 1}), "refuse:logit_bias", None),
        ("logit_bias ' 5'", COMP, comp(logit_bias={" 5": 1}), "refuse:logit_bias", None),
        ("logit_bias '5_0'", COMP, comp(logit_bias={"5_0": 1}), "refuse:logit_bias", None),
        ("logit_bias -1", COMP, comp(logit_bias={"-1": 1}), "refuse:logit_bias", None),
        (
            "logit_bias forces a token",
            COMP,
            comp(logit_bias={"300": 100}, temperature=0, logprobs=0),
            "work",
            None,  # filled below: the token's text is read from /tokenize
        ),
        ("logit_bias 101", COMP, comp(logit_bias={"5": 101}), "refuse:logit_bias", None),
        (
            "logit_bias NaN",
            COMP,
            '{"model":"support","prompt":"a","logit_bias":{"5":NaN}}',
            "refuse:logit_bias",
            None,
        ),
        (
            "logit_bias Infinity",
            COMP,
            '{"model":"support","prompt":"a","logit_bias":{"5":Infinity}}',
            "refuse:logit_bias",
            None,
        ),
        (
            "temperature NaN",
            COMP,
            '{"model":"support","prompt":"a","temperature":NaN}',
            "refuse:temperature",
            None,
        ),
        ("top_p NaN", COMP, '{"model":"support","prompt":"a","top_p":NaN}', "refuse:top_p", None),
        ("min_p NaN", COMP, '{"model":"support","prompt":"a","min_p":NaN}', "refuse:min_p", None),
        (
            "presence_penalty -Infinity",
            COMP,
            '{"model":"support","prompt":"a","presence_penalty":-Infinity}',
            "refuse:presence_penalty",
            None,
        ),
        (
            "repetition_penalty NaN",
            COMP,
            '{"model":"support","prompt":"a","repetition_penalty":NaN}',
            "refuse:repetition_penalty",
            None,
        ),
        (
            "chat temperature Infinity",
            CHAT,
            '{"model":"support","messages":[{"role":"user","content":"a"}],"temperature":Infinity}',
            "refuse:temperature",
            None,
        ),
        ("user 256", COMP, comp(user="u" * 256), "work", None),
        ("user 257", COMP, comp(user="u" * 257), "refuse:user", None),
        ("user with newline and ANSI", COMP, comp(user="a\n\x1b[31mb"), "work", None),
        (
            "stream_options without stream",
            COMP,
            comp(stream_options={"include_usage": True}),
            "refuse:stream_options",
            None,
        ),
        (
            "include_obfuscation",
            COMP,
            comp(stream=True, stream_options={"include_obfuscation": False}),
            "refuse:include_obfuscation",
            None,
        ),
        (
            "continuous_usage_stats",
            COMP,
            comp(
                stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}
            ),
            "work-stream",
            None,
        ),
        (
            "n 3 best_of 5 echo logprobs 5 stop",
            COMP,
            comp(n=3, best_of=5, echo=True, logprobs=5, stop=[" is"], seed=3),
            "work",
            n_choices(3),
        ),
        (
            "echo max_tokens 0 n 2 best_of 3",
            COMP,
            comp(echo=True, max_tokens=0, n=2, best_of=3, logprobs=1),
            "work",
            n_choices(2),
        ),
        (
            "echo batch of 2 token-id prompts n 2",
            COMP,
            comp(prompt=[[1, 2, 3], [4, 5]], echo=True, n=2),
            "work",
            n_choices(4),
        ),
        ("stream best_of 3 n 1", COMP, comp(stream=True, best_of=3), "refuse:best_of", None),
        ("best_of 2 n 3", COMP, comp(best_of=2, n=3), "refuse:best_of", None),
        ("best_of true", COMP, comp(best_of=True), "refuse:best_of", None),
        ("n 17", COMP, comp(n=17), "refuse:n", None),
        ("seed max n 2", COMP, comp(seed=2**63 - 1, n=2), "refuse:seed", None),
        ("seed max n 1", COMP, comp(seed=2**63 - 1), "work", None),
        ("seed min n 2", COMP, comp(seed=-(2**63), n=2), "work", n_choices(2)),
        (
            "min_tokens above max_tokens",
            COMP,
            comp(min_tokens=5, max_tokens=4),
            "refuse:min_tokens",
            None,
        ),
        (
            "echo with echo text",
            COMP,
            comp(echo=True, max_tokens=1),
            "work",
            echoed("The acme support team"),
        ),
        ("priority field", COMP, comp(priority=-100), "refuse:priority", None),
        ("cache_salt", COMP, comp(cache_salt="x"), "refuse:cache_salt", None),
        (
            "truncate_prompt_tokens",
            COMP,
            comp(truncate_prompt_tokens=2),
            "refuse:truncate_prompt_tokens",
            None,
        ),
        ("allowed_token_ids", COMP, comp(allowed_token_ids=[5]), "refuse:allowed_token_ids", None),
        ("bad_words", COMP, comp(bad_words=["x"]), "refuse:bad_words", None),
        ("use_beam_search", COMP, comp(use_beam_search=True), "refuse:use_beam_search", None),
        ("prompt_logprobs", COMP, comp(prompt_logprobs=1), "refuse:prompt_logprobs", None),
        (
            "return_tokens_as_token_ids",
            COMP,
            comp(return_tokens_as_token_ids=True),
            "refuse:return_tokens_as_token_ids",
            None,
        ),
        (
            "skip_special_tokens false",
            COMP,
            comp(skip_special_tokens=False),
            "refuse:skip_special_tokens",
            None,
        ),
        ("guided_json", COMP, comp(guided_json={}), "refuse:guided_json", None),
        ("vllm_xargs", COMP, comp(vllm_xargs={"a": 1}), "refuse:vllm_xargs", None),
        ("request_id in body", COMP, comp(request_id="x"), "refuse:request_id", None),
        (
            "lora_request in body",
            COMP,
            comp(lora_request={"lora_name": "x"}),
            "refuse:lora_request",
            None,
        ),
        # chat
        ("response_format text", CHAT, chat(response_format={"type": "text"}), "work", None),
        (
            "response_format json_object",
            CHAT,
            chat(response_format={"type": "json_object"}),
            "refuse:response_format",
            None,
        ),
        (
            "response_format text plus key",
            CHAT,
            chat(response_format={"type": "text", "x": 1}),
            "refuse:response_format",
            None,
        ),
        ("tools []", CHAT, chat(tools=[]), "work", None),
        ("tools [{}]", CHAT, chat(tools=[{}]), "refuse:tools", None),
        ("tool_choice none", CHAT, chat(tool_choice="none"), "work", None),
        ("tool_choice auto", CHAT, chat(tool_choice="auto"), "refuse:tool_choice", None),
        ("tool_choice required", CHAT, chat(tool_choice="required"), "refuse:tool_choice", None),
        ("parallel_tool_calls", CHAT, chat(parallel_tool_calls=True), "work", None),
        ("service_tier priority", CHAT, chat(service_tier="priority"), "refuse:service_tier", None),
        ("service_tier flex", CHAT, chat(service_tier="flex"), "refuse:service_tier", None),
        ("service_tier auto", CHAT, chat(service_tier="auto"), "work", None),
        ("store true", CHAT, chat(store=True), "refuse:store", None),
        ("metadata", CHAT, chat(metadata={"a": "b"}), "refuse:metadata", None),
        ("user in chat", CHAT, chat(user="x"), "work", None),
        ("logprobs top 20", CHAT, chat(logprobs=True, top_logprobs=20), "work", top_size(20)),
        ("logprobs top 0", CHAT, chat(logprobs=True, top_logprobs=0), "work", top_size(0)),
        (
            "top_logprobs 21",
            CHAT,
            chat(logprobs=True, top_logprobs=21),
            "refuse:top_logprobs",
            None,
        ),
        ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), "refuse:top_logprobs", None),
        (
            "max_completion_tokens vs max_tokens",
            CHAT,
            chat(max_completion_tokens=3),
            "refuse:max_tokens",
            None,
        ),
        (
            "max_completion_tokens alone",
            CHAT,
            {"model": ADAPTER, "messages": msgs(), "max_completion_tokens": 3, "ignore_eos": True},
            "work",
            lambda a: None if a["usage"]["completion_tokens"] == 3 else str(a["usage"]),
        ),
        ("reasoning_effort high", CHAT, chat(reasoning_effort="high"), "work", None),
        (
            "reasoning_effort huge",
            CHAT,
            chat(reasoning_effort="ultra"),
            "refuse:reasoning_effort",
            None,
        ),
        ("echo in chat", CHAT, chat(echo=True), "refuse:echo", None),
        ("best_of in chat", CHAT, chat(best_of=2), "refuse:best_of", None),
        ("suffix in chat", CHAT, chat(suffix=""), "refuse:suffix", None),
        (
            "continue_final_message",
            CHAT,
            chat(continue_final_message=True),
            "refuse:continue_final_message",
            None,
        ),
        ("chat_template", CHAT, chat(chat_template="{{ 7*7 }}"), "refuse:chat_template", None),
        (
            "chat_template_kwargs",
            CHAT,
            chat(chat_template_kwargs={"enable_thinking": True}),
            "refuse:chat_template_kwargs",
            None,
        ),
        ("documents", CHAT, chat(documents=[{"t": "x"}]), "refuse:documents", None),
        ("functions", CHAT, chat(functions=[]), "refuse:functions", None),
        ("function_call", CHAT, chat(function_call="none"), "refuse:function_call", None),
        (
            "tool message with tool_call_id",
            CHAT,
            chat(messages=[{"role": "tool", "content": "x", "tool_call_id": "c1"}]),
            "refuse:tool_call_id",
            None,
        ),
        (
            "assistant with tool_calls",
            CHAT,
            chat(messages=[{"role": "assistant", "content": None, "tool_calls": []}, *msgs()]),
            "refuse:tool_calls",
            None,
        ),
        (
            "assistant with refusal",
            CHAT,
            chat(messages=[{"role": "assistant", "content": "x", "refusal": None}, *msgs()]),
            "refuse:refusal",
            None,
        ),
        (
            "image part",
            CHAT,
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "refuse:type",
            None,
        ),
        (
            "text part with cache_control",
            CHAT,
            chat(
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x", "cache_control": {}}],
                    }
                ]
            ),
            "refuse:cache_control",
            None,
        ),
        (
            "role function",
            CHAT,
            chat(messages=[{"role": "function", "content": "x"}]),
            "refuse:role",
            None,
        ),
        (
            "role developer",
            CHAT,
            chat(messages=[{"role": "developer", "content": "x"}, *msgs()]),
            "work",
            None,
        ),
        (
            "name 257",
            CHAT,
            chat(messages=[{"role": "user", "content": "x", "name": "n" * 257}]),
            "refuse:name",
            None,
        ),
        (
            "n 2 logprobs stream include_usage",
            CHAT,
            chat(
                n=2,
                logprobs=True,
                top_logprobs=3,
                stream=True,
                stream_options={"include_usage": True},
            ),
            "work-stream",
            None,
        ),
        (
            "add_generation_prompt false",
            CHAT,
            chat(add_generation_prompt=False),
            "refuse:add_generation_prompt",
            None,
        ),
        (
            "tokenize reasoning_effort",
            "/tokenize",
            {"model": ADAPTER, "messages": msgs(), "reasoning_effort": "high"},
            "refuse:reasoning_effort",
            None,
        ),
        (
            "tokenize tools",
            "/tokenize",
            {"model": ADAPTER, "messages": msgs(), "tools": []},
            "refuse:tools",
            None,
        ),
        (
            "tokenize add_special_tokens false (prompt)",
            "/tokenize",
            {"model": ADAPTER, "prompt": "x", "add_special_tokens": False},
            "refuse:add_special_tokens",
            None,
        ),
        (
            "detokenize huge id",
            "/detokenize",
            {"model": ADAPTER, "tokens": [10**12]},
            "refuse:tokens",
            None,
        ),
    ]
    return c


def names_field(answer: dict[str, Any], field: str) -> bool:
    error = answer.get("error") or {}
    param = error.get("param") or ""
    return param == field or param.endswith("." + field) or field in (error.get("message") or "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", default=ADAPTER)
    args = parser.parse_args()
    client = httpx.Client(base_url=args.url, timeout=120)
    auth = {"Authorization": f"Bearer {args.key}", "Content-Type": "application/json"}
    token_300 = client.post("/detokenize", json={"tokens": [300]}, headers=auth).json()["prompt"]
    statuses: Counter[str] = Counter()
    wrong = []
    all_cases = cases()
    for name, path, given, expect, given_check in all_cases:
        check = all_token(token_300) if name == "logit_bias forces a token" else given_check
        body = given
        if isinstance(body, dict) and args.model != ADAPTER and body.get("model") == ADAPTER:
            body = body | {"model": args.model}
        if isinstance(body, str) and args.model != ADAPTER:
            body = body.replace('"support"', json.dumps(args.model))
        content = body if isinstance(body, str) else json.dumps(body)
        got = client.post(path, content=content, headers=auth)
        statuses[str(got.status_code)] += 1
        problem = None
        if expect.startswith("refuse:"):
            field = expect.split(":", 1)[1]
            if got.status_code != 400:
                problem = f"status {got.status_code}: {got.text[:200]}"
            elif not names_field(got.json(), field):
                problem = f"400 not naming {field}: {got.text[:300]}"
        elif got.status_code != 200:
            problem = f"status {got.status_code}: {got.text[:300]}"
        elif expect == "work-stream":
            if "continuous_usage_stats" in name:
                problem = usage_chunks(got.text)
            elif "[DONE]" not in got.text:
                problem = "no [DONE]"
        elif check is not None:
            problem = check(got.json())
        if problem:
            wrong.append({"case": name, "expected": expect, "got": problem})
    sys.stdout.write(
        json.dumps(
            {
                "name": "field-matrix",
                "url": args.url,
                "model": args.model,
                "cases": len(all_cases),
                "statuses": dict(sorted(statuses.items())),
                "unexpected": wrong,
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
