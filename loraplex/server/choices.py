"""One HTTP request, many engine requests: ``n``, ``best_of`` and batched prompts.

Each prompt of a request becomes ``best_of`` (else ``n``) sibling engine requests. Sibling ``i``
of prompt ``p`` sits in slot ``p * best_of + i``; its engine id is the request's server-made id
plus ``-<slot>`` (no suffix when there is one sibling in all), its seed is ``seed + i`` (vLLM's
rule, so choice ``i`` is reproducible alone), and siblings after the first name the first as
``prefix_leader`` so the engine computes their shared prompt once. OpenAI's choice index is
``p * n + rank``: the slot itself unless ``best_of`` > ``n`` keeps the ``n`` siblings with the
highest cumulative logprob.

``Fanout`` merges the siblings' streams into one stream of ``(slot, delta)``. Its rule: the first
error of any sibling ends the whole request with that error (as vLLM), and every sibling still
running is aborted at once, so no KV blocks or adapter leases outlive the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

import anyio

from loraplex.engine.protocol import EngineClient, EngineRequest, TokenDelta, TokenLogprob
from loraplex.sampling import MAX_SEED
from loraplex.server.errors import invalid_request
from loraplex.server.protocol import MAX_BATCH_PROMPTS, CompletionRequest, SamplingFields

DEFAULT_MAX_CHOICES = MAX_BATCH_PROMPTS  # engine requests one HTTP request may fan out into
Slotted = tuple[int, TokenDelta]  # a sibling's slot and one of its deltas


@dataclass(frozen=True)
class Echo:
    """A completions prompt shown before its choices' text (``echo``)."""

    text: str  # the prompt as sent (token-id prompts: decoded)
    first_token_id: int  # the prompt's first token (it has no logprob)


@dataclass(frozen=True)
class Shape:
    """How many engine requests a request becomes."""

    num_prompts: int  # prompts in the request (1 unless a batch)
    n: int  # choices returned per prompt
    best_of: int  # siblings generated per prompt (>= n)

    @property
    def num_siblings(self) -> int:
        return self.num_prompts * self.best_of

    @property
    def ranks(self) -> bool:
        """Whether the returned choices are picked among more siblings than they number."""
        return self.best_of > self.n


def shape_of(body: SamplingFields, num_prompts: int, max_choices: int) -> Shape:
    """The request's fan-out, bounded by ``max_choices`` (a 400 naming the field past it)."""
    n = body.num_choices
    best_of = body.best_of if isinstance(body, CompletionRequest) and body.best_of else n
    if best_of < n:
        raise invalid_request(f"best_of {best_of} is invalid; expected >= n ({n})", "best_of")
    if best_of > n and body.stream:
        raise invalid_request(
            f"best_of {best_of} > n {n} cannot stream (the best are known only at the end)",
            "best_of",
        )
    field_name = "best_of" if best_of > n else "n"
    if best_of > max_choices:
        raise invalid_request(
            f"{field_name} {best_of} is invalid; expected at most {max_choices} choices per "
            "request (a fixed limit)",
            field_name,
        )
    if num_prompts * best_of > max_choices:
        raise invalid_request(
            f"{num_prompts} prompts x {field_name} {best_of} is {num_prompts * best_of} "
            f"choices; expected at most {max_choices} per request (a fixed limit)",
            "prompt",
        )
    if body.seed is not None and body.seed + best_of - 1 > MAX_SEED:
        raise invalid_request(
            f"seed {body.seed} is invalid with {best_of} choices; expected <= "
            f"{MAX_SEED - best_of + 1} (choice i uses seed + i)",
            "seed",
        )
    return Shape(num_prompts, n, best_of)


def siblings(
    base_id: str, per_prompt: Sequence[EngineRequest], shape: Shape
) -> list[EngineRequest]:
    """Every engine request of the fan-out, in slot order (see the module docstring)."""
    if shape.num_siblings == 1:
        return [replace(per_prompt[0], request_id=base_id)]
    out = []
    for p, request in enumerate(per_prompt):
        leader = f"{base_id}-{p * shape.best_of}"
        for i in range(shape.best_of):
            seed = request.params.seed
            params = request.params if seed is None else replace(request.params, seed=seed + i)
            out.append(
                replace(
                    request,
                    request_id=f"{base_id}-{p * shape.best_of + i}",
                    params=params,
                    prefix_leader=leader if i else None,
                )
            )
    return out


@dataclass
class ChoiceOutput:
    """Everything one sibling produced (a non-streaming choice before formatting)."""

    parts: list[str] = field(default_factory=list)  # text pieces, in order
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, if asked
    has_logprobs: bool = False  # whether any delta carried logprobs
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # from the first delta
    finish_reason: str | None = None  # the last delta's
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    prompt_tokens: int = 0  # prompt length
    completion_tokens: int = 0  # tokens generated

    def add(self, delta: TokenDelta) -> None:
        self.parts.append(delta.text)
        if delta.logprobs is not None:
            self.has_logprobs = True
            self.logprobs.extend(delta.logprobs)
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason
        self.prompt_tokens = delta.prompt_tokens
        self.completion_tokens = delta.completion_tokens

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def cumulative_logprob(self) -> float:
        """What ``best_of`` ranks by; a RuntimeError when the engine sent no logprobs (the
        ranking would otherwise be silently arbitrary)."""
        if not self.has_logprobs and self.completion_tokens:
            raise RuntimeError("the engine returned no logprobs; best_of cannot rank choices")
        return sum(entry.logprob for entry in self.logprobs)


def best(outputs: Sequence[ChoiceOutput], shape: Shape) -> list[list[ChoiceOutput]]:
    """Per prompt, the ``n`` choices returned: all siblings, or the ``n`` with the highest
    cumulative logprob, best first (ties: the lower slot)."""
    groups = [
        list(outputs[p * shape.best_of : (p + 1) * shape.best_of]) for p in range(shape.num_prompts)
    ]
    if not shape.ranks:
        return groups
    return [sorted(group, key=lambda out: -out.cumulative_logprob)[: shape.n] for group in groups]


def prompt_only(delta: TokenDelta) -> TokenDelta:
    """``delta`` without its generated token: ``echo`` with ``max_tokens`` 0 asks the engine
    for one token (its prompt logprobs come with it) and shows only the prompt."""
    reason = "length" if delta.finish_reason is not None else None
    return replace(
        delta, token_ids=(), text="", finish_reason=reason, completion_tokens=0,
        logprobs=None if delta.logprobs is None else (), stop_reason=None,
    )  # fmt: skip


@dataclass(frozen=True)
class Sibling:
    """One engine request of a fan-out."""

    engine_id: str  # its engine request id (what abort takes)
    slot: int  # where its output goes (module docstring)
    stream: AsyncIterator[TokenDelta]  # its output


class Fanout:
    """The siblings' streams as one stream of ``(slot, delta)``.

    Any error from a sibling aborts every other (``abort``) before it propagates; a consumer
    that stops early must call ``abort`` itself (it is idempotent and shielded from
    cancellation). One sibling is read directly, without a task per sibling.
    """

    def __init__(
        self, engine: EngineClient, members: Sequence[Sibling], *, show_prompt_only: bool = False
    ) -> None:
        self._engine = engine
        self._members = list(members)
        self._prompt_only = show_prompt_only
        self._finished: set[int] = set()  # slots whose stream ended (nothing to abort)
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._items = self._one() if len(members) == 1 else self._merged()

    def __aiter__(self) -> Fanout:
        return self

    async def __anext__(self) -> Slotted:
        try:
            slot, delta = await anext(self._items)
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.abort()
            raise
        if delta.finish_reason is not None:
            self._finished.add(slot)
        return slot, prompt_only(delta) if self._prompt_only else delta

    async def _one(self) -> AsyncIterator[Slotted]:
        member = self._members[0]
        async for delta in member.stream:
            yield member.slot, delta
        self._finished.add(member.slot)

    async def _merged(self) -> AsyncIterator[Slotted]:
        queue: asyncio.Queue[tuple[int, TokenDelta | Exception | None]] = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(self._pump(m, queue)) for m in self._members]
        running = len(self._members)
        while running:
            slot, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield slot, item

    async def _pump(
        self, member: Sibling, queue: asyncio.Queue[tuple[int, TokenDelta | Exception | None]]
    ) -> None:
        try:
            async for delta in member.stream:
                queue.put_nowait((member.slot, delta))
        except Exception as exc:  # the consumer re-raises it (and aborts the rest)
            queue.put_nowait((member.slot, exc))
            return
        self._finished.add(member.slot)
        queue.put_nowait((member.slot, None))

    async def pause(self) -> None:
        """Its client stopped reading: every sibling still running stops generating until
        ``resume`` (``EngineClient.pause``)."""
        for member in self._members:
            if member.slot not in self._finished and not self._closed:
                await self._engine.pause(member.engine_id)

    async def resume(self) -> None:
        """Its client reads again: every sibling still running generates again."""
        for member in self._members:
            if member.slot not in self._finished and not self._closed:
                await self._engine.resume(member.engine_id)

    async def abort(self) -> None:
        """Aborts every sibling still running and closes every stream (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks)
            await _aclose(self._items)
            for member in self._members:
                if member.slot not in self._finished:
                    await self._engine.abort(member.engine_id)
                await _aclose(member.stream)


async def _aclose(stream: AsyncIterator[object]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
