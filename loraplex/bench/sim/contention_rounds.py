"""``sim calibrate-fleet``'s contention rounds, and where their adapters are placed.

A round: ``clients`` clients each sending ``CONTENTION_PER_CLIENT`` warm requests back to back
(a closed loop: the count in flight stays put), client ``i`` on adapter ``i mod n``; its figure
is the completed requests over its wall time.

Placement. The router places a revision resident nowhere by rendezvous hashing over the
replicas' ids (``router/placement.py``), which Ray draws afresh for each deployment, so warming
``c0``, ``c1``, ``c2`` put 0 / 2 / 2, 2 / 2 / 1 or 1 / 2 / 2 adapters on the replicas (SPREAD's
holds). The fleet offers no operator placement on one named replica (its pins and prefetches
reach every replica) and no routing hint that names one. So ``place`` registers
``CANDIDATES_PER_ADAPTER`` candidates per adapter wanted and warms them one at a time,
observing where each landed (``FleetSlots``: the replica whose GPU-slot count grew, read from
the fleet's status), keeping a candidate only if its replica holds the fewest kept ones so far
and evicting the rest; it stops once it keeps as many as wanted: one per replica when there are
as many as replicas. The simulator's rounds (``contention_fit``) are placed by the same rule
over the simulator's own router (``simulated_placement``), so both sides run the rounds one
adapter per replica. With 4 candidates per adapter on 3 replicas, a replica is missed with
probability about 3 x (2/3)^12 = 2 %; the report says where each one went.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loraplex.bench.serve.driver import DriveConfig, prompt_ids, send_one
from loraplex.bench.sim.calibrate_run import HOP_OUTPUT_TOKENS
from loraplex.bench.sim.contention_fit import RoundShape, warm_replicas
from loraplex.bench.workloads import ATTENTION_TARGETS, TraceAdapter, TraceRequest
from loraplex.sim.calibrate_fleet import ContentionSample
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel

CONTENTION_PER_CLIENT = 4  # requests each client of a contention round sends back to back
CONTENTION_PROMPT_TOKENS = 16  # the prompt of every contention request (bench sim's traces')
CONTENTION_RANK = 8
CANDIDATES_PER_ADAPTER = 4  # candidates registered per adapter the rounds use


def candidates(tenant: str, wanted: int) -> list[TraceAdapter]:
    """The rounds' candidate adapters: rank 8, attention targets, ``c0`` ... in warm order."""
    count = wanted * CANDIDATES_PER_ADAPTER
    return [TraceAdapter(tenant, f"c{i}", CONTENTION_RANK, ATTENTION_TARGETS) for i in range(count)]


@dataclass
class Placement:
    """Where the rounds' adapters went."""

    adapters: list[TraceAdapter] = field(default_factory=list)  # kept, in warm order
    replicas: list[int] = field(default_factory=list)  # the replica index each landed on
    skipped: list[str] = field(default_factory=list)  # candidates tried and dropped

    def counts(self, replicas: int) -> list[int]:
        """Kept adapters per replica index."""
        return [self.replicas.count(i) for i in range(replicas)]


def place(
    pool: Sequence[TraceAdapter], wanted: int, replicas: int,
    land: Callable[[TraceAdapter, Sequence[TraceAdapter]], int | None],
    drop: Callable[[TraceAdapter], None],
) -> Placement:  # fmt: skip
    """Warm candidates from ``pool`` in order (``land(candidate, kept so far)``: the replica
    index it landed on, None when that was not seen once) until ``wanted`` are kept, each kept
    only on a replica that holds the fewest kept ones; the rest are ``drop``-ped."""
    if wanted < 1 or replicas < 1:
        raise ValueError(f"wanted {wanted} / replicas {replicas} are invalid; expected >= 1")
    placement = Placement()
    for candidate in pool:
        if len(placement.adapters) == wanted:
            break
        where = land(candidate, placement.adapters)
        counts = placement.counts(replicas)
        if where is not None and 0 <= where < replicas and counts[where] == min(counts):
            placement.adapters.append(candidate)
            placement.replicas.append(where)
        else:
            drop(candidate)
            placement.skipped.append(candidate.name)
    return placement


class FleetSlots:
    """``place``'s callbacks on a real fleet: warm a candidate, read every replica's GPU-slot
    count (``counts``, which waits for the replicas' next status), and name the one that grew;
    drop evicts the candidate from every replica's GPU slots (``evict``)."""

    def __init__(
        self, warm: Callable[[TraceAdapter], bool], counts: Callable[[], list[int]],
        evict: Callable[[TraceAdapter], None],
    ) -> None:  # fmt: skip
        self._warm = warm
        self._counts = counts
        self._evict = evict
        self._before: list[int] | None = None

    def land(self, adapter: TraceAdapter, kept: Sequence[TraceAdapter] = ()) -> int | None:
        """The replica ``adapter`` landed on (``kept``: warm already, nothing to redo)."""
        before = self._before if self._before is not None else self._counts()
        warmed = self._warm(adapter)
        after = self._before = self._counts()
        grown = [i for i, (a, b) in enumerate(zip(after, before, strict=False)) if a > b]
        return grown[0] if warmed and len(after) == len(before) and len(grown) == 1 else None

    def drop(self, adapter: TraceAdapter) -> None:
        self._evict(adapter)
        self._before = self._counts()


def evict_from_slots(client: httpx.Client, adapter: TraceAdapter) -> None:
    """Drops ``adapter``'s GPU-slot copies on every replica (the fleet's admin evict)."""
    ref = f"{adapter.tenant}/{adapter.name}@r1"  # bench/serve/fleet.prepare_fleet's revision
    client.post("/admin/residency/evict", json={"model": ref, "tier": "L0"}).raise_for_status()


async def one_round(
    url: str, key: str, adapters: Sequence[TraceAdapter], clients: int, *,
    rng: random.Random, drive: DriveConfig,
) -> ContentionSample | None:  # fmt: skip
    """``clients`` clients sending back to back: completed requests per second and their
    median TTFT; None when nothing completed."""
    length, tokens = CONTENTION_PROMPT_TOKENS, HOP_OUTPUT_TOKENS

    async def client(index: int) -> list[float]:
        adapter = adapters[index % len(adapters)]
        request = TraceRequest(0.0, adapter.tenant, adapter.name, length, tokens)
        ttfts = []
        for _ in range(CONTENTION_PER_CLIENT):
            ids = prompt_ids(rng, length, drive.vocab_size)
            record = await send_one(
                url, request, key=key, ids=ids, arrival=time.monotonic(), tier="L3", config=drive
            )
            if record.ok and record.ttft_s is not None:
                ttfts.append(record.ttft_s)
        return ttfts

    start = time.monotonic()
    done = [
        t for ttfts in await asyncio.gather(*(client(i) for i in range(clients))) for t in ttfts
    ]
    if not done:
        return None
    return ContentionSample(
        clients, len(done) / (time.monotonic() - start), statistics.median(done)
    )


def contention_samples(
    url: str, key: str, adapters: Sequence[TraceAdapter], *, in_flight: Sequence[int],
    rounds: int, gap_s: float, seed: int, drive: DriveConfig,
) -> list[ContentionSample]:  # fmt: skip
    """``rounds`` rounds per in-flight count, each after ``gap_s`` idle; a round with nothing
    completed makes no sample."""
    rng = random.Random(seed + 13)
    samples = []
    for clients in sorted(set(in_flight)):
        for _ in range(rounds):
            time.sleep(gap_s)
            sample = asyncio.run(one_round(url, key, adapters, clients, rng=rng, drive=drive))
            if sample is not None:
                samples.append(sample)
    return samples


def simulated_rounds(
    base: CostModel, asset_dir: Path, *, replicas: int, wanted: int, tenant: str,
    request_timeout_s: float,
) -> tuple[SimConfig, RoundShape, Placement]:  # fmt: skip
    """The fleet ``bench sim`` simulates (``replicas``) and what a contention round sends, for
    the fit by simulation (``contention_fit``): ``wanted`` adapters placed in the simulator by
    the rule the real fleet's were (``place``), each candidate warmed after the kept ones."""
    from loraplex.bench.sim.config import SimBenchConfig
    from loraplex.bench.sim.simulated import adapter_sizes, sim_config
    from loraplex.bench.sim.validate import RealSettings
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
    pool = candidates(tenant, wanted)
    sizes, per_rank = adapter_sizes(assets.base_model_dir, pool)
    settings = RealSettings(replicas=replicas, request_timeout_s=request_timeout_s)
    sim = SimConfig(**sim_config(SimBenchConfig(settings=settings), "fleet", per_rank, {}))

    def shape(adapters: Sequence[TraceAdapter]) -> RoundShape:
        return RoundShape(
            tuple((a.tenant, a.name, a.rank, sizes[(a.tenant, a.name)]) for a in adapters),
            CONTENTION_PER_CLIENT, CONTENTION_PROMPT_TOKENS, HOP_OUTPUT_TOKENS,
        )  # fmt: skip

    def land(adapter: TraceAdapter, kept: Sequence[TraceAdapter]) -> int:
        # a simulated fleet warms only what the rounds use: nothing to drop
        return warm_replicas(base, sim, shape([*kept, adapter]))[-1]

    placed = place(pool, wanted, replicas, land, lambda _: None)
    return sim, shape(placed.adapters or pool[:wanted]), placed
