"""What the comparators measure on a running server, and the run's cache of it.

A qualification run calls the comparators once per cell; many cells share a token shape and
probes, so each measurement is taken once per run and kept in ``ctx.workdir`` (a JSON file per
measurement, written whole or not at all): a load sweep per (model, prompt tokens, output
tokens), one judgment per (model, prompt, expected), and every cold start seen.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from loraplex.qualify.baselines.load import LoadSpec, closed_loop, complete
from loraplex.qualify.baselines.pricing import LoadLevel, Sample
from loraplex.qualify.baselines.server import Running

# Closed-loop concurrencies swept per token shape: from one client to the server's
# max_num_seqs (32, every sequence decoding at once).
LEVELS = (1, 2, 4, 8, 16, 32)
QUICK_LEVELS = (1, 4)


def levels_for(quick: bool) -> tuple[int, ...]:
    return QUICK_LEVELS if quick else LEVELS


def requests_at(concurrency: int, quick: bool) -> int:
    """Requests one level sends: at least two rounds of every client (so a level is not all
    ramp-up and drain), fewer in quick mode."""
    return max(4, 2 * concurrency) if quick else max(8, 2 * concurrency)


class RunCache:
    """JSON values under ``root``, one file per key (keys are hashed into file names)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / (hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + ".json")

    def get(self, key: str) -> object | None:
        try:
            text = self._path(key).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        stored = json.loads(text)
        return stored["value"] if stored.get("key") == key else None

    def put(self, key: str, value: object) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(key)
        staged = path.with_suffix(f".{os.getpid()}.partial")
        staged.write_text(json.dumps({"key": key, "value": value}), encoding="utf-8")
        staged.replace(path)


def level_to_json(level: LoadLevel) -> dict[str, object]:
    return asdict(level)


def level_from_json(raw: dict[str, object]) -> LoadLevel:
    samples = raw["samples"]
    if not isinstance(samples, list):
        raise ValueError(f"a cached load level's samples are not a list: {samples!r}")
    return LoadLevel(
        int(str(raw["concurrency"])),
        float(str(raw["wall_s"])),
        tuple(Sample(bool(s["ok"]), s["ttft_s"], s["tpot_s"]) for s in samples),
    )


def sweep(
    server: Running, prompt_tokens: int, output_tokens: int, vocab_size: int, quick: bool
) -> list[LoadLevel]:
    """A closed-loop level at each concurrency of ``levels_for(quick)``, lowest first, each
    with prompts of its own (no level reuses another's cached prefixes)."""
    out = []
    for concurrency in levels_for(quick):
        spec = LoadSpec(
            concurrency,
            requests_at(concurrency, quick),
            prompt_tokens,
            output_tokens,
            vocab_size,
            seed=concurrency,
        )
        out.append(closed_loop(server, spec))
    return out


def probe_max_tokens(expected: str) -> int:
    """Tokens enough to produce ``expected``: a token is at least one character."""
    return len(expected) + 1


def judge(server: Running, prompt: str, expected: str) -> tuple[bool, int]:
    """Whether the greedy continuation of ``prompt`` starts with ``expected`` (as release
    probes judge), and the prompt's length in the server's tokens."""
    answer = complete(server, prompt, probe_max_tokens(expected))
    return answer.text.startswith(expected), answer.prompt_tokens
