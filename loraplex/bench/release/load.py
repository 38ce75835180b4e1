"""The steady traffic of ``loraplex bench release``: open-loop Zipf requests with ``user``
fields, each answer rated through ``POST /v1/feedback``.

Every request is the adapter's probe prompt, greedy and streamed, through the adapter's alias
(never a pinned revision), with a ``user`` drawn from the tenant's pool so a canary assigns it
to one side for the whole release. The client rates each answer: good when its text is one the
client accepts for that adapter right now (``Expectations``), bad otherwise. Streams use
``sse_client`` (one connection each: cheap on shared cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from loraplex.bench.release.check import Answer
from loraplex.bench.sse_client import SseClientError, StreamingPost
from loraplex.bench.workloads import zipf_weights

REVISION_HEADER = "x-loraplex-revision"


@dataclass(frozen=True)
class LoadConfig:
    """How the steady traffic is shaped."""

    rate: float = 12.0  # mean requests per second (Poisson arrivals)
    zipf_s: float = 1.0  # popularity exponent over the routes, most popular first
    users_per_tenant: int = 64  # size of each tenant's pool of ``user`` values
    request_timeout_s: float = 30.0  # every request ends within this
    seed: int = 0  # arrivals, adapter and user draws

    def __post_init__(self) -> None:
        for name in ("rate", "zipf_s", "users_per_tenant", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected > 0")


@dataclass(frozen=True)
class Route:
    """One adapter the traffic calls."""

    tenant: str  # owning tenant (its key is used)
    name: str  # adapter name, sent as the model string (the alias)
    prompt: str  # the adapter's probe prompt
    max_tokens: int  # tokens of its probe continuation (it ends at EOS there)

    @property
    def adapter(self) -> str:
        return f"{self.tenant}/{self.name}"


@dataclass
class Phase:
    """The phase the run is in; the orchestrator moves it, arrivals read it."""

    name: str = "A1"  # e.g. A1, B1, B2, A2
    kind: str = "baseline"  # release_check.BASELINE or RELEASING


@dataclass
class Expectations:
    """Per adapter, the answer texts the clients accept right now (what they rate good)."""

    accepted: dict[str, frozenset[str]] = field(default_factory=dict)  # tenant/name -> texts

    def is_good(self, adapter: str, text: str) -> bool:
        return text in self.accepted.get(adapter, frozenset())


@dataclass
class StreamResult:
    """What one streamed completion returned."""

    status: int = 0  # HTTP status; 0: none
    header_revision: str | None = None  # x-loraplex-revision
    revision: str | None = None  # loraplex.revision of the chunks
    request_id: str | None = None  # the chunks' id
    text: str = ""  # the completion text
    first_s: float | None = None  # monotonic time of the first text
    error: str | None = None  # error type or body


def _consume(line: str, result: StreamResult) -> None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    chunk = json.loads(line[len("data: ") :])
    if "error" in chunk:
        result.error = str(chunk["error"].get("type", "error"))
        return
    result.request_id = chunk.get("id", result.request_id)
    info = chunk.get("loraplex") or {}
    result.revision = info.get("revision", result.revision)
    for choice in chunk.get("choices") or ():
        if choice.get("text"):
            result.first_s = result.first_s or time.monotonic()
            result.text += choice["text"]


async def stream_completion(
    url: str, key: str, body: dict[str, object], timeout_s: float
) -> StreamResult:
    """One streamed /v1/completions call; never raises for a failed or timed-out request."""
    result = StreamResult()

    async def send() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with StreamingPost(url, "/v1/completions", body, headers) as post:
            assert post.reply is not None  # read on entry
            result.status = post.reply.status
            result.header_revision = post.reply.headers.get(REVISION_HEADER)
            if post.reply.status != 200:
                result.error = (await post.body()).decode("utf-8", errors="replace")[:200]
                return
            async for line in post.lines():
                _consume(line, result)

    try:
        await asyncio.wait_for(send(), timeout_s)
    except TimeoutError:
        result.error = "timeout"
    except (OSError, SseClientError) as exc:
        result.error = type(exc).__name__
    return result


def to_answer(
    result: StreamResult, route: Route, user: str, t_s: float, phase: tuple[str, str]
) -> Answer:
    """The record of one request (``ttft_s`` left None: the caller knows its arrival)."""
    return Answer(
        t_s=t_s,
        phase=phase[0],
        phase_kind=phase[1],
        tenant=route.tenant,
        adapter=route.name,
        user=user,
        status=result.status,
        ttft_s=None,
        revision=result.revision,
        header_revision=result.header_revision,
        text=result.text,
        request_id=result.request_id,
        error=result.error,
    )


def completion_body(route: Route, user: str) -> dict[str, object]:
    return {
        "model": route.name,
        "prompt": route.prompt,
        "max_tokens": route.max_tokens,
        "temperature": 0,
        "stream": True,
        "user": user,
    }


class SteadyLoad:
    """Open-loop traffic until ``stop``; ``answers`` grows as requests finish (in the loop)."""

    def __init__(
        self,
        url: str,
        keys: dict[str, str],
        routes: Sequence[Route],
        *,
        config: LoadConfig,
        phase: Phase,
        expectations: Expectations,
    ) -> None:
        self.url, self.keys, self.routes, self.config = url, keys, tuple(routes), config
        self.phase, self.expectations = phase, expectations
        self.answers: list[Answer] = []
        self.feedback_statuses: dict[str, int] = {}  # HTTP status of the ratings -> count
        self._weights = zipf_weights(len(self.routes), config.zipf_s)
        self._rng = random.Random(config.seed)

    async def run(self, stop: asyncio.Event) -> None:
        """Sends requests at Poisson arrivals until ``stop`` is set, then waits for them."""
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        next_s = start
        while not stop.is_set():
            next_s += self._rng.expovariate(self.config.rate)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_s - time.monotonic()))
            if stop.is_set():
                break
            route = self._rng.choices(self.routes, self._weights)[0]
            user = f"{route.tenant}-u{self._rng.randrange(self.config.users_per_tenant):02d}"
            task = asyncio.create_task(self._one(route, user, next_s, start))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def _one(self, route: Route, user: str, arrival: float, start: float) -> None:
        phase_name, phase_kind = self.phase.name, self.phase.kind
        key = self.keys[route.tenant]
        body = completion_body(route, user)
        result = await stream_completion(self.url, key, body, self.config.request_timeout_s)
        answer = to_answer(result, route, user, arrival - start, (phase_name, phase_kind))
        answer = replace(
            answer, ttft_s=None if result.first_s is None else result.first_s - arrival
        )
        self.answers.append(answer)
        if answer.ok and answer.request_id is not None:
            good = self.expectations.is_good(route.adapter, answer.text)
            await self._rate(key, answer.request_id, good)

    async def _rate(self, key: str, request_id: str, good: bool) -> None:
        body = {"request_id": request_id, "rating": "good" if good else "bad"}
        headers = {"Authorization": f"Bearer {key}"}

        async def send() -> str:
            async with StreamingPost(self.url, "/v1/feedback", body, headers) as post:
                assert post.reply is not None  # read on entry
                await post.body()
                return str(post.reply.status)

        try:
            status = await asyncio.wait_for(send(), self.config.request_timeout_s)
        except (TimeoutError, OSError, SseClientError):
            status = "0"  # no answer: reported in feedback_statuses
        self.feedback_statuses[status] = self.feedback_statuses.get(status, 0) + 1
