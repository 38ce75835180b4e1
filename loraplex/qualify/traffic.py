"""One cell's run: its traffic (shape-sized greedy requests over the cell's active adapters, in
the popularity's order, ``concurrency`` at a time), one quality probe per revision it reached,
and the hostile tenant beside it for the whole time."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from loraplex.qualify.cells import Cell, draw_indices
from loraplex.qualify.client import Admin, Answer, stream_completion
from loraplex.qualify.hostile import HostileReport, probe_foreign, storm
from loraplex.qualify.plan import QualifyPlan
from loraplex.qualify.population import HOSTILE
from loraplex.qualify.targets import Target

FIRST_TOKEN_ID = 4  # below: the demo tokenizer's special tokens


@dataclass(frozen=True)
class Sent:
    """One request of a cell and what came back."""

    kind: str  # "traffic" or "probe"
    target: Target  # the adapter it named and how it is judged
    prompt: str | tuple[int, ...]  # text (probes) or token ids (traffic)
    max_tokens: int  # as sent
    ignore_eos: bool  # as sent (traffic runs to max_tokens; probes stop at EOS)
    sampled: bool  # its text is checked against the offline reference
    answer: Answer  # what the client saw (filled in when it is sent)


@dataclass(frozen=True)
class CellRun:
    """Everything one cell sent and saw."""

    cell: Cell  # the matrix point
    prompt_tokens: int  # prompt tokens actually sent (the shape's, fitted to the context)
    sent: list[Sent]  # traffic then probes
    wall_s: float  # first send to last answer, traffic and probes
    hostile: HostileReport  # the hostile tenant's view
    # Every revision the cell's active and deployment adapters name, traffic or not (a separate
    # deployment needs a replica for each, docs/qualification.md "Separate deployments").
    active_refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class CellInputs:
    """What a cell's run needs besides the plan."""

    url: str  # the deployment
    keys: dict[str, str]  # tenant -> API key
    active: list[Target]  # the cell's active adapters, most popular first
    extra: list[Target]  # deployment adapters sent in every cell
    hostile_aliases: list[str]  # the hostile tenant's own adapters
    vocab_size: int  # for token-id prompts
    max_model_len: int  # prompt + output fit in it


def fitted_prompt_tokens(cell: Cell, max_model_len: int) -> int:
    """The shape's prompt tokens, cut so prompt + output fit the model's context."""
    return max(1, min(cell.shape.prompt_tokens, max_model_len - cell.shape.output_tokens - 1))


def plan_sends(cell: Cell, inputs: CellInputs, plan: QualifyPlan, rng: random.Random) -> list[Sent]:
    """The traffic requests, then one probe per target reached (probes run after traffic)."""
    n_prompt = fitted_prompt_tokens(cell, inputs.max_model_len)
    picks = [inputs.active[i] for i in draw_indices(cell, plan.traffic.requests_per_cell, rng)]
    picks += inputs.extra
    sampled = set(rng.sample(range(len(picks)), min(plan.traffic.reference_sample, len(picks))))
    sends = []
    for i, target in enumerate(picks):
        ids = tuple(rng.randrange(FIRST_TOKEN_ID, inputs.vocab_size) for _ in range(n_prompt))
        sends.append(
            Sent("traffic", target, ids, cell.shape.output_tokens, True, i in sampled, Answer())
        )
    for target in {t.alias: t for t in picks}.values():
        sends.append(
            Sent(
                "probe", target, target.probe_prompt, target.probe_max_tokens, False, True, Answer()
            )
        )
    return sends


async def run_cell(
    cell: Cell, inputs: CellInputs, plan: QualifyPlan, admin: Admin, rng: random.Random
) -> CellRun:
    """Sends the cell's requests with the hostile tenant beside them; returns what was seen."""
    sends = plan_sends(cell, inputs, plan, rng)
    report = HostileReport()
    hostile_key = inputs.keys[HOSTILE]
    victims = sorted({s.target.alias for s in sends if s.target.private})
    start = time.monotonic()
    storm_task = asyncio.create_task(
        storm(inputs.url, hostile_key, inputs.hostile_aliases,
              requests=plan.isolation.hostile_requests_per_cell,
              timeout_s=plan.traffic.request_timeout_s, report=report)
    )  # fmt: skip
    probe_task = asyncio.to_thread(probe_foreign, admin, hostile_key, victims, report)
    traffic = [s for s in sends if s.kind == "traffic"]
    await _send_all(inputs, traffic, plan)
    await _send_all(inputs, [s for s in sends if s.kind == "probe"], plan)
    wall_s = time.monotonic() - start
    await asyncio.gather(storm_task, probe_task)
    refs = tuple(dict.fromkeys(r for t in [*inputs.active, *inputs.extra] for r in t.revisions))
    prompt_tokens = fitted_prompt_tokens(cell, inputs.max_model_len)
    return CellRun(cell, prompt_tokens, sends, wall_s, report, refs)


async def _send_all(inputs: CellInputs, sends: list[Sent], plan: QualifyPlan) -> None:
    gate = asyncio.Semaphore(plan.traffic.concurrency)

    async def one(sent: Sent) -> None:
        body: dict[str, Any] = {
            "model": sent.target.alias,
            "prompt": list(sent.prompt) if isinstance(sent.prompt, tuple) else sent.prompt,
            "max_tokens": sent.max_tokens,
            "temperature": 0,
            "ignore_eos": sent.ignore_eos,
        }
        async with gate:
            key = inputs.keys[sent.target.tenant]
            await stream_completion(
                inputs.url, key, body, plan.traffic.request_timeout_s, sent.answer,
                max_retries=plan.traffic.max_retries,
            )  # fmt: skip

    await asyncio.gather(*(one(s) for s in sends))
