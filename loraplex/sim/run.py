"""``simulate(trace, config, cost_model)``: one deterministic run on a virtual clock.

The event loop is the adapter cache's own discrete-event executor (``SimExecutor``): one heap
ordered by (time, submission sequence) shared by every replica's cache loads, engine steps and
request arrivals, on one ``ManualClock``; nothing reads wall time. Arrivals are fed in trace
order (the heap holds only what is in flight, never the whole trace): the loop runs every event
due by a request's ``t_s``, the router (a fleet) picks its replica, and the engine receives it
after the cost model's front, IPC and (fleet) network overheads. With the cost model's
``cores`` (or a fleet's ``fleet_contention``), steps and hops share the machine's CPU
(``sim/cpu.py``).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

from loraplex.artifacts.identity import AdapterKey
from loraplex.clock import ManualClock
from loraplex.engine.protocol import EngineRequest
from loraplex.residency.cache import SimExecutor
from loraplex.residency.pipeline import Footprint
from loraplex.router import RouteRequest
from loraplex.sampling import SamplingParams
from loraplex.sim.config import SimConfig
from loraplex.sim.cost_model import CostModel
from loraplex.sim.cpu import CpuShare
from loraplex.sim.fleet import SimFleetRouter
from loraplex.sim.hops import Hops
from loraplex.sim.names import check_adapter_keys, check_replica_ids
from loraplex.sim.outcome import Outcome, OutcomeLog
from loraplex.sim.refusal import refusal
from loraplex.sim.replica import SimReplica
from loraplex.sim.result import SimResult, cache_figures, fleet_figures, request_figures
from loraplex.sim.step_cost import adapter_shapes
from loraplex.sim.trace import TraceRecord

_BASE_DIGEST = hashlib.sha256(b"loraplex-sim-base").hexdigest()
_MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True)
class SimAdapter:
    """A trace adapter as the simulated caches see it."""

    key: AdapterKey  # a deterministic identity derived from (owner, adapter)
    rank: int  # for the step cost's rank mix
    footprint: Footprint  # bytes per tier


def adapter_key(tenant: str, adapter: str) -> AdapterKey:
    """A deterministic key for a trace adapter (digests derived from its names)."""
    name, _, revision = adapter.partition("@")
    digest = hashlib.sha256(f"{tenant}/{adapter}".encode()).hexdigest()
    return AdapterKey(_BASE_DIGEST, tenant, name, revision or "r1", digest)


def adapter_place(tenant: str, adapter: str) -> tuple[str, str]:
    """(owner, ``name@revision``) of a trace adapter as the server keys its copy: the request
    log names another tenant's public adapter ``owner/name@revision`` (``server/request_log``),
    and its callers share the owner's one copy."""
    name, at, revision = adapter.partition("@")
    owner, slash, own_name = name.partition("/")
    if slash and owner and own_name:
        return owner, own_name + at + revision
    return tenant, adapter


def trace_adapters(
    trace: Sequence[TraceRecord],
    config: SimConfig,
    keys: Mapping[tuple[str, str], AdapterKey] | None = None,
) -> dict[tuple[str, str], SimAdapter]:
    """Every adapter the trace names, with its rank and bytes (a rank above ``max_lora_rank``,
    or one adapter given two shapes, is a ValueError naming it), and its key: ``keys``' for its
    (owner, adapter) where given, else ``adapter_key``'s. A line that gives no shape (neither
    ``rank`` nor ``size_bytes``) takes the shape another line gives its adapter, else the
    config's defaults: a request log written across the upgrade that added the shape holds both
    kinds of lines for one revision (newop4)."""
    keys = keys or {}
    given = {
        adapter_place(r.tenant, r.adapter): (r.rank, r.size_bytes)
        for r in trace
        if r.adapter is not None and (r.rank is not None or r.size_bytes is not None)
    }
    found: dict[tuple[str, str], SimAdapter] = {}
    for record in trace:
        if record.adapter is None:
            continue
        where = adapter_place(record.tenant, record.adapter)
        shape = (record.rank, record.size_bytes)
        if shape == (None, None):
            shape = given.get(where, shape)
        rank = shape[0] or config.default_rank
        size = shape[1] or rank * config.bytes_per_rank
        if rank > config.max_lora_rank:
            raise ValueError(
                f"rank {rank} of adapter {record.tenant}/{record.adapter} is invalid; expected "
                f"<= max_lora_rank {config.max_lora_rank}"
            )
        known = found.get(where)
        if known is not None:
            if (known.rank, known.footprint.memory_bytes) != (rank, size):
                raise ValueError(
                    f"adapter {record.tenant}/{record.adapter} has two shapes in the trace: "
                    f"rank {known.rank} / {known.footprint.memory_bytes} bytes and {rank} / {size}"
                )
            continue
        footprint = Footprint(slot_bytes=config.slot_bytes, memory_bytes=size, disk_bytes=size)
        found[where] = SimAdapter(keys.get(where) or adapter_key(*where), rank, footprint)
    return found


def simulate(
    trace: Sequence[TraceRecord],
    config: SimConfig,
    cost_model: CostModel,
    *,
    skip_steps: bool = True,
    keep_outcomes: list[Outcome] | None = None,
    replica_ids: Sequence[str] | None = None,
    adapter_keys: Mapping[tuple[str, str], AdapterKey] | None = None,
) -> SimResult:
    """Runs ``trace`` (sorted by ``t_s``) through ``config``'s deployment, charged by
    ``cost_model``; the same inputs give the same result. ``skip_steps`` False steps every
    steady decode batch one event at a time (``sim/decode_run.py``; the same result, slower,
    except with the cost model's ``cores`` or ``fleet_contention``: a run keeps its first step's
    factor, ``sim/cpu.py``). ``keep_outcomes``, when given, receives each request's
    ``Outcome`` in trace order (the result holds figures only). ``replica_ids``: the replicas'
    names as the router sees them (``check_replica_ids``; None: ``rank-0``, .., the names a real
    fleet's router places by, its replicas' deployment ranks: ``fleet/routing.PlacementNames``):
    a cold revision's placement is a hash of its key and these names (``router/placement.py``).
    Other names model a router placing by other ids (before 2026-12-06 a real fleet's router
    placed by the random ids Ray Serve draws afresh for each deployment). ``adapter_keys``:
    (owner, adapter) -> the key a server serves that adapter under (``names.check_adapter_keys``;
    the router names a revision by its key, whose digests no trace carries), the rest keyed by
    ``adapter_key``; with a real fleet's keys and ranks, cold revisions go where it places them."""
    ids = check_replica_ids(replica_ids, config.replicas)
    keys = check_adapter_keys(adapter_keys)
    with _frozen_heap():
        return _simulate(
            trace, config, cost_model, skip_steps, keep_outcomes, replica_ids=ids, keys=keys
        )


YOUNG_COLLECTION_EVERY = 50_000  # net allocations between young collections in a run (700)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """The objects alive when a run starts (the trace's records above all: a million in a scale
    run) moved out of the collector's reach for the run (``gc.freeze``), then back: they are
    never garbage within it, and every full collection would walk them all again. Left alone
    where something is frozen already (its owner unfreezes). The young generation is collected
    every ``YOUNG_COLLECTION_EVERY`` allocations instead of 700 for the run: each step makes and
    drops a few dozen objects (plans, chunks, futures), almost none in cycles; collecting them
    every 700 took 1.36 of the 17.1 CPU s of a 20,000-request scale run, 0.55 of 15.8 s at
    50,000 (one run each, timed by ``gc.callbacks``)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], YOUNG_COLLECTION_EVERY), *thresholds[1:])
    try:
        if gc.get_freeze_count():
            yield
            return
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
    finally:
        gc.set_threshold(*thresholds)


def _simulate(
    trace: Sequence[TraceRecord],
    config: SimConfig,
    cost_model: CostModel,
    skip_steps: bool,
    keep_outcomes: list[Outcome] | None,
    *,
    replica_ids: tuple[str, ...] | None,
    keys: Mapping[tuple[str, str], AdapterKey],
) -> SimResult:
    clock = ManualClock()
    executor = SimExecutor(clock)
    adapters = trace_adapters(trace, config, keys)
    footprints = {a.key: a.footprint for a in adapters.values()}
    shapes = adapter_shapes(footprints, {a.key: a.rank for a in adapters.values()})
    contention = cost_model.fleet_contention if config.replicas > 1 else None
    modelled = cost_model.cores is not None or contention is not None
    cpu = CpuShare(cost_model.cores, contention) if modelled else None
    replicas = [
        SimReplica(
            i,
            config,
            cost_model,
            executor,
            footprints=footprints,
            shapes=shapes,
            skip_steps=skip_steps,
            cpu=cpu,
            replica_id=None if replica_ids is None else replica_ids[i],
        )
        for i in range(config.replicas)
    ]
    fleet = SimFleetRouter(config, clock, replicas) if config.replicas > 1 else None
    hops = Hops(cost_model, fleet is not None, config.seed, cpu)
    outcomes = OutcomeLog()
    last_t = 0.0
    for index, record in enumerate(trace):
        if record.t_s < last_t:
            raise ValueError(f"trace[{index}].t_s {record.t_s} is invalid; expected sorted")
        last_t = record.t_s
        executor.run_until(record.t_s)
        outcome = Outcome(record.t_s, record.tenant)
        outcomes.add(outcome)
        if _refused(record, config, outcome):
            continue  # answered by the front: no route, no hop, no engine
        named = record.adapter
        adapter = None if named is None else adapters[adapter_place(record.tenant, named)]
        request = _engine_request(index, record, adapter)
        replica = replicas[0]
        if fleet is not None:
            key = None if adapter is None else fleet.name(adapter.key)
            route = RouteRequest(key, None, record.prompt_tokens)
            replica, outcome.reason = fleet.route(route, request.request_id)
        outcome.replica = replica.index
        hop = hops.charged(replica, record.t_s)
        executor.call_at(record.t_s + hop, _submit(replica, request, outcome))
    executor.drain()
    for replica in replicas:
        replica.cache.check_integrity()
        if replica.num_live:  # every request ends: by finishing, a refusal or its deadline
            raise RuntimeError(f"{replica.replica_id} ended with {replica.num_live} live requests")
    ended = outcomes.outcomes()
    if keep_outcomes is not None:
        keep_outcomes.extend(ended)
    return _result(trace, config, cost_model, replicas=replicas, fleet=fleet, outcomes=ended)


def _refused(record: TraceRecord, config: SimConfig, outcome: Outcome) -> bool:
    """Whether the server refuses ``record`` before queueing it (``sim/refusal.py``): then
    ``outcome`` ends at its arrival, marked with the server's code."""
    answer = refusal(record, config.max_model_len)
    if answer is None:
        return False
    outcome.end_s = record.t_s
    outcome.error = answer.error
    outcome.refused = answer.code
    return True


def _engine_request(index: int, record: TraceRecord, adapter: SimAdapter | None) -> EngineRequest:
    # Each request's prompt repeats one token of its own: no two requests share a KV prefix.
    token = index % _MAX_TOKEN_ID
    return EngineRequest(
        request_id=f"sim-{index}",
        tenant=record.tenant,
        adapter_key=None if adapter is None else adapter.key,
        prompt_token_ids=(token,) * record.prompt_tokens,
        params=SamplingParams(max_tokens=record.output_tokens, ignore_eos=True),
    )


def _submit(replica: SimReplica, request: EngineRequest, outcome: Outcome) -> Callable[[], None]:
    return lambda: replica.submit(request, outcome)


def _result(
    trace: Sequence[TraceRecord],
    config: SimConfig,
    cost_model: CostModel,
    *,
    replicas: Sequence[SimReplica],
    fleet: SimFleetRouter | None,
    outcomes: Sequence[Outcome],
) -> SimResult:
    summaries = [r.cache.summary() for r in replicas]
    metrics = {
        **request_figures(outcomes, config.timeout_s),
        **cache_figures(summaries, len(outcomes)),
        "engine_steps": sum(r.num_steps for r in replicas),
    }
    if fleet is not None:
        metrics.update(fleet_figures(outcomes, fleet.decisions, config.replicas))
    described = {
        **asdict(config),
        "hardware": cost_model.hardware,
        "cost_model_validated": cost_model.validated,
        "trace_requests": len(trace),
        "trace_adapters": len(
            {adapter_place(r.tenant, r.adapter) for r in trace if r.adapter is not None}
        ),
    }
    return SimResult(described, metrics)
