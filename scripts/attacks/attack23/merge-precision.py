#!/usr/bin/env python3
"""A tenant's adapter with huge finite weights, merged by ``auto``: do other tenants' greedy
answers stay what they were unmerged?

Against one ``loraplex serve --mode auto`` on the demo set. The admin uploads a copy of
``--source`` (a demo adapter directory) whose A and B are each scaled by ``sqrt(--factor)``
(so ``s B A`` by ``--factor``; finite, as validation requires) as the attacker tenant's
``--name`` (``POST /admin/adapters/upload``). The victim's greedy completion (``--victim-model``,
``max_tokens`` 16, ``logprobs`` 1) is taken once as the baseline, then the attacker's
``--threads`` threads send completions of the huge adapter (``max_tokens`` 64, ``ignore_eos``)
for ``--flood-s`` seconds while the victim repeats its request every ``--victim-gap-s``; each
victim answer is compared with the baseline (tokens; largest logprob difference) and tagged
with ``loraplex_mode_merged`` read from ``/metrics`` just before it. Prints one JSON line:

    scripts/attacks/attack23/merge-precision.py --url http://127.0.0.1:18231 \\
        --admin-key "$ADMIN_KEY" --hog-key "$ACME_KEY" --victim-key "$GLOBEX_KEY" \\
        --source .loraplex-assets/test-small/adapters/acme/billing/r1 --factor 1e10
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from safetensors.torch import load_file, save_file


def scaled_copy(source: Path, factor: float, out: Path) -> Path:
    tensors = {
        k: (v.double() * factor**0.5).float()
        for k, v in load_file(source / "adapter_model.safetensors").items()
    }
    save_file(tensors, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_bytes((source / "adapter_config.json").read_bytes())
    return out


def merged_gauge(client: httpx.Client, admin: str) -> list[str]:
    text = client.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
    return [
        line
        for line in text.splitlines()
        if line.startswith("loraplex_mode_merged") and not line.endswith(" 0.0")
    ]


def victim_answer(
    client: httpx.Client, key: str, model: str, prompt: str
) -> tuple[list[str], list[float]]:
    body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1}
    got = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    got.raise_for_status()
    lp = got.json()["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--hog-key", required=True)
    parser.add_argument("--victim-key", required=True)
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--factor", type=float, default=1e10)
    parser.add_argument("--tenant", default="acme")
    parser.add_argument("--name", default="huge")
    parser.add_argument("--victim-model", default="globex/search")
    parser.add_argument("--prompt", default="The globex search")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--flood-s", type=float, default=60.0)
    parser.add_argument("--victim-gap-s", type=float, default=2.0)
    args = parser.parse_args()
    client = httpx.Client(base_url=args.url, timeout=120)
    admin = {"Authorization": f"Bearer {args.admin_key}"}
    with tempfile.TemporaryDirectory() as tmp:
        adapter = scaled_copy(args.source, args.factor, Path(tmp))
        files = {
            "config": ("adapter_config.json", (adapter / "adapter_config.json").read_bytes()),
            "weights": (
                "adapter_model.safetensors",
                (adapter / "adapter_model.safetensors").read_bytes(),
            ),
        }
        data = {"tenant": args.tenant, "name": args.name, "revision": "r1"}
        up = client.post("/admin/adapters/upload", files=files, data=data, headers=admin)
    upload = {"status": up.status_code, "body": up.text[:200]}
    base_tokens, base_lps = victim_answer(client, args.victim_key, args.victim_model, args.prompt)
    stop = time.monotonic() + args.flood_s
    hog_status: dict[str, int] = {}

    def hog() -> None:
        own = httpx.Client(base_url=args.url, timeout=120)
        body = {
            "model": f"{args.tenant}/{args.name}",
            "prompt": "The acme",
            "max_tokens": 64,
            "ignore_eos": True,
        }
        while time.monotonic() < stop:
            try:
                code = str(
                    own.post(
                        "/v1/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {args.hog_key}"},
                    ).status_code
                )
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            hog_status[code] = hog_status.get(code, 0) + 1

    threads = [threading.Thread(target=hog, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    answers = []
    while time.monotonic() < stop:
        time.sleep(args.victim_gap_s)
        merged = merged_gauge(client, args.admin_key)
        tokens, lps = victim_answer(client, args.victim_key, args.victim_model, args.prompt)
        same = tokens == base_tokens
        diff = max(abs(a - b) for a, b in zip(lps, base_lps, strict=True)) if same else None
        answers.append(
            {
                "merged": [re.sub(r"\s+\S+$", "", m) for m in merged],
                "same": same,
                "max_lp_diff": diff,
            }
        )
    for thread in threads:
        thread.join()
    after = victim_answer(client, args.victim_key, args.victim_model, args.prompt)
    sys.stdout.write(
        json.dumps(
            {
                "name": "merge-precision",
                "url": args.url,
                "factor": args.factor,
                "upload": upload,
                "hog_status": hog_status,
                "victim_answers": len(answers),
                "victim_while_merged": sum(1 for a in answers if a["merged"]),
                "victim_changed_while_merged": sum(
                    1 for a in answers if a["merged"] and not a["same"]
                ),
                "victim_changed": sum(1 for a in answers if not a["same"]),
                "victim_max_lp_diff_same": max(
                    (a["max_lp_diff"] for a in answers if a["same"]), default=None
                ),
                "after_same": after[0] == base_tokens,
                "merged_at_end": merged_gauge(client, args.admin_key),
                "answers": answers,
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
