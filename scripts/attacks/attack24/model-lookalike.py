#!/usr/bin/env python3
"""Can a tenant reach, or learn the existence of, another tenant's adapter through look-alike
model strings (case, Unicode confusables, zero-width and combining characters, NFC/NFD,
whitespace, separators)?

Against one ``loraplex serve`` with the hostile tenant's key: every variant of the victim's
private adapter names (and, as controls, of names that exist nowhere) is sent as ``model`` to
``/v1/completions``, ``/v1/chat/completions``, ``/tokenize`` and ``GET /v1/models/{model}``.
Each answer's body, with the model string replaced by ``<M>``, is grouped: an existing private
name and a name that exists nowhere must get the same status and the same body. Then
``--timing-rounds`` rounds alternate (ABBA) a private name with a nonexistent name of the same
length on ``GET /v1/models/{model}`` and ``/v1/completions``, and report each side's median and
the ratio (run it under the bench lock when the numbers are reported). One JSON line:

    scripts/attacks/attack24/model-lookalike.py --url http://127.0.0.1:18241 --key "$ACME"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import unicodedata
from urllib.parse import quote

import httpx

from loraplex.errors import quoted

VICTIM = "globex"
PRIVATE = ["search", "codegen", "summarize", "translate"]
NOWHERE = ["sxarch", "codegem", "summarise", "translat3"]  # same lengths, exist nowhere
CONTROL = ["saarch", "codegan", "summarizz", "translata"]  # the same, for the null comparison


def variants(owner: str, name: str) -> dict[str, str]:
    """Look-alikes of ``owner/name`` (the kind of variant -> the model string)."""
    full = f"{owner}/{name}"
    cyr = name.replace("e", "\u0435").replace("a", "\u0430").replace("o", "\u043e")
    return {
        "exact": full,
        "pinned": f"{full}@r1",
        "bare": name,
        "upper": full.upper(),
        "title": f"{owner.title()}/{name.title()}",
        "fullwidth": "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in full),
        "cyrillic": f"{owner}/{cyr}",
        "zero-width": f"{owner}/{name[:2]}\u200b{name[2:]}",
        "zwj-tail": f"{full}\u200d",
        "bom-head": f"\ufeff{full}",
        "combining": f"{full}\u0301",
        "nfd-of-accented": unicodedata.normalize("NFD", f"{owner}/{name[:-1]}\u00e9"),
        "nfc-of-accented": unicodedata.normalize("NFC", f"{owner}/{name[:-1]}\u00e9"),
        "trailing-space": f"{full} ",
        "leading-space": f" {full}",
        "double-slash": f"{owner}//{name}",
        "backslash": f"{owner}\\{name}",
        "fraction-slash": f"{owner}\u2044{name}",
        "dot-segment": f"{owner}/./{name}",
        "tab": f"{owner}/\t{name}",
        "nul": f"{full}\x00",
        "at-empty": f"{full}@",
        "at-upper": f"{full}@R1",
    }


def normalized(text: str, model: str) -> str:
    """``text`` with every form of ``model`` an answer may carry (as error messages quote it,
    JSON-escaped or not; as sent; URL-quoted) replaced by ``<M>``."""
    forms = [quoted(model), repr(model), json.dumps(model)[1:-1], model, quote(model, safe="")]
    for form in [*forms, *(json.dumps(f)[1:-1] for f in forms)]:
        text = text.replace(form, "<M>")
    return text


def ask(client: httpx.Client, route: str, model: str, headers: dict[str, str]) -> httpx.Response:
    if route == "card":
        return client.get(f"/v1/models/{quote(model, safe='/@')}", headers=headers)
    if route == "tokenize":
        return client.post("/tokenize", json={"model": model, "prompt": "hi"}, headers=headers)
    if route == "chat":
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        return client.post("/v1/chat/completions", json=body, headers=headers)
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    return client.post("/v1/completions", json=body, headers=headers)


def probe(client: httpx.Client, headers: dict[str, str]) -> dict[str, object]:
    reached: list[str] = []
    differ: list[str] = []
    statuses: dict[str, int] = {}
    sent = 0
    for route in ("completions", "chat", "tokenize", "card"):
        for private, nowhere in zip(PRIVATE, NOWHERE, strict=True):
            theirs = variants(VICTIM, private)
            control = variants(VICTIM, nowhere)
            for kind, model in theirs.items():
                if route == "card" and kind == "dot-segment":
                    continue  # httpx removes "/./" from a URL path: the exact string, sent again
                got = ask(client, route, model, headers)
                other = ask(client, route, control[kind], headers)
                sent += 2
                statuses[f"{route} {got.status_code}"] = (
                    statuses.get(f"{route} {got.status_code}", 0) + 1
                )
                if got.status_code < 400:
                    reached.append(f"{route} {model!r} -> {got.status_code}")
                a = (got.status_code, normalized(got.text, model))
                b = (other.status_code, normalized(other.text, control[kind]))
                if a != b:
                    differ.append(f"{route} {kind}: {a[0]} {a[1][:160]!r} vs {b[0]} {b[1][:160]!r}")
    return {
        "sent": sent,
        "statuses": statuses,
        "reached": reached,
        "differ": differ[:8],
        "num_differ": len(differ),
    }


def timing(client: httpx.Client, headers: dict[str, str], rounds: int) -> dict[str, object]:
    """Rounds of A B C C B A (C B A A B C every other round): A a private name, B and C names
    that exist nowhere (B vs C is the null comparison: what noise alone gives); medians in ms."""
    names = {"private": PRIVATE, "nowhere": NOWHERE, "control": CONTROL}
    out: dict[str, object] = {}
    for route in ("card", "completions"):
        samples: dict[str, list[float]] = {side: [] for side in names}
        for i in range(rounds):
            sides = ["private", "nowhere", "control"]
            order = sides + sides[::-1] if i % 2 == 0 else sides[::-1] + sides
            for side in order:
                model = f"{VICTIM}/{names[side][i % len(names[side])]}"
                start = time.perf_counter()
                got = ask(client, route, model, headers)
                samples[side].append((time.perf_counter() - start) * 1e3)
                if got.status_code != 404:
                    raise SystemExit(f"{model}: {got.status_code} {got.text}")
        med = {side: statistics.median(values) for side, values in samples.items()}
        out[route] = {
            **{f"{side}_median_ms": round(value, 3) for side, value in med.items()},
            "private_over_nowhere": round(med["private"] / med["nowhere"], 3),
            "control_over_nowhere": round(med["control"] / med["nowhere"], 3),
            "samples_each": len(samples["private"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True, help="the hostile tenant's API key")
    parser.add_argument("--timing-rounds", type=int, default=0)
    parser.add_argument("--skip-probe", action="store_true")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.key}"}
    with httpx.Client(base_url=args.url, timeout=60) as client:
        line: dict[str, object] = {"name": "model-lookalike", "url": args.url}
        if not args.skip_probe:
            line |= probe(client, headers)
        if args.timing_rounds:
            line["timing"] = timing(client, headers, args.timing_rounds)
    sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
