"""The simulator's cost model: what one engine step, one tier transfer and one hop cost.

A cost-model file is JSON (``schema`` ``loraplex-sim-cost/1``), written by ``loraplex sim
calibrate`` from measurements on a running server, or by hand for hardware that cannot be
measured here, in which case every number cites its source in ``sources`` and ``validated`` is
false until a calibration on that hardware replaces the file.

Step time (seconds) of a batch with ``decode_tokens`` decode tokens (one per decoding sequence),
``prefill_tokens`` prompt tokens (prompt chunks and recomputes), ``revisions`` distinct adapter
revisions and ``rank_tokens`` = sum over the batch's tokens of their adapter's rank (0 for
base-model tokens)::

    step_s = step_fixed_s + per_token_s * decode_tokens
             + per_prefill_token_s * prefill_tokens
             + per_revision_s * revisions + per_rank_token_s * rank_tokens

plus, when the file prices LoRA work by the adapters' weights (both terms optional)::

             + per_byte_token_s * byte_tokens + per_revision_width_s * revision_widths

with ``byte_tokens`` = sum over the batch's tokens of their adapter's A+B bytes (``size_bytes``
of a trace: the LoRA FLOPs of a token grow with its adapter's parameters) and
``revision_widths`` = sum over the distinct revisions of ``size_bytes / rank`` (the bytes of
one rank of the adapter: layers x the summed widths of its target modules; the fixed work of
each LoRA op a revision makes the step run, whatever its rank and tokens). ``rank_tokens``
cannot tell an attention-only adapter from one on every linear layer; these can. A file
without them (written before they existed) prices neither, the old model exactly.

A decode row pays its sequence's per-row work (sampling, the attention call, the row's
bookkeeping) with its one token; a prompt chunk pays it once for many tokens, so a prompt token
costs less than a decode token, and a line fitted on decode batches over-prices prefill. A file
without ``step.per_prefill_token_s`` (written before the term existed) keeps the old model:
prompt tokens cost ``per_token_s`` (``StepCost.per_prefill_token_s`` None), and saving such a
model writes no such key.

A step that holds prompt tokens (``prefill_tokens`` > 0: a prompt chunk or a recompute) also
pays ``per_prefill_step_s`` once, however many prompts it holds: what the engine's prompt path
adds to a step beyond its tokens (the prompts' attention calls per layer, the mixed batch's
gathers and scatters; the engine attends equal-length prompts in one call). ``sim calibrate``
fits it on the engine's own timeline of lone prefill steps (docs/simulator.md, "Prefill priced
on the engine's timeline"). A file without the key charges nothing for it (the model before).

A request's hop to its engine (``front_s + ipc_s``, plus ``network_s`` in a fleet) may vary by
request: ``hop_jitter_s``, when given, holds the quantiles (at evenly spaced probabilities from
0 to 1) of lone warm requests' TTFT less their group's median, as ``sim calibrate`` measured
them; each request adds one draw from it (a seeded stream, so a run stays deterministic), the
hop floored at 0. A deterministic hop makes every warm request's TTFT the same, and a
percentile that falls between the warm and the cold requests then jumps from one to the other,
where a real server's spread moves it smoothly. A file without the key adds nothing.

In a fleet (more than one replica) the hop adds ``network_s`` (ingress to replica), each hop
draws from ``network_jitter_s`` instead of ``hop_jitter_s`` when given (the spread of lone warm
requests through the fleet), and a replica's CPU work, every step and every load stage, costs
``fleet_cpu_scale`` times its price (the replicas co-located on one machine with the fleet's other
processes, against a lone server; ``sim calibrate-fleet`` measures all three, the scale on lone
decode steps: that load stages slow alike is the model's assumption).

With ``cores`` (the CPU cores the deployment's processes share), the machine's CPU is shared:
a step that starts while ``n`` other CPU jobs run (other replicas' steps, requests' hops in
flight: the front's and the fleet hop's work) costs ``max(1, (n + 1) / cores)`` times its
price. The factor is read when the step starts (a steady decode run keeps its first step's).
A file without the key charges no contention. A fleet's ``fleet_contention`` (``sim/cpu.py``:
the measured slowdown per request with 1, 2, 4, 8 ... requests in flight through the fleet)
replaces ``cores`` in a fleet's simulation and stretches its steps and hops by the requests in
flight; a file without it reads as before, and a lone server never reads it.

A lease that waits for a load (its adapter not in a GPU slot) reaches its request
``lease_handoff_s[tier]`` seconds after the load completes, ``tier`` the one it was loaded from
(L1, L2 or L3): what the real engine spends on such a lease beyond the load's stage seconds and
what a lease granted at once waits (asking for it on a miss, the loader's pick-up and the
completed lease's return to the engine thread), measured by ``sim calibrate --self`` on the
engine's own timeline of each request (``server/request_log.ENGINE_FIELDS``). The copy is
resident when the load completes (other requests find it there); only the waiting request pays.
A file without the key (or a tier without a value) charges nothing.

A fleet replica's load stages cost ``fleet_load_scale`` times their lone price where the file
has it, in place of ``fleet_cpu_scale`` (a decode step's ratio, which prices them otherwise):
``sim calibrate-fleet`` (``--cold-requests``) and ``bench sim --calibrate-fleet-interleaved``'s
passes measure it on lone cold requests through the fleet (``sim/calibrate_fleet.fit_load_scale``).
A file without the key reads as before.

Asking for a lease that misses the GPU slots holds the engine thread ``lease_ask_s`` seconds
longer than a hit's (the cache lock, the policy's choice, the load's submission): the replica's
engine plans nothing meanwhile, and the load is submitted when that ask ends (each miss of one
step after the ones before it). ``sim calibrate --self`` measures it on the same timelines: the
median ``asked_s`` of its lone requests whose lease waited for a load less that of those leased
at once; a file that has it measured its ``lease_handoff_s`` from the ask's end. A file without
the key reads as 0: the ask is inside ``lease_handoff_s``, as before (docs/simulator.md, the
lease's ask on arrival).

``host_probe``, when given, is a fixed CPU probe's timing when the figures were measured
(``sim/host_speed.py``): a reference of the host's speed, which ``bench sim`` compares with the
same probe before each real run. The simulator never reads it; a file without it is the same.

A tier transfer of ``n`` bytes over a link costs ``fixed_s + n / bytes_per_s``. With
``load_cpu_shared`` (a CPU-only server, whose loader and engine share one core), a transfer
stage that starts while a step runs also delays that replica's next step by its seconds.

A load's stages before the copy into a slot (L3 -> L2 and L2 -> L1: fetch, verify, commit,
read) that start while the replica's engine has requests running (decoding or prefilling:
steps run beside the load) cost ``load_busy_scale`` times their price: the loader's thread
shares the CPU and the interpreter with the steps, and on this project's CPU demo server such a
load took 2.8 times its lone price in traces (docs/simulator.md, SIMCOLD). ``sim calibrate``
measures it on its own cold loads, each timed alone and then with warm requests decoding
beside it. The copy is not scaled (the engine waits for it between steps). A file without the
key reads as 1.0: loads cost their lone price whatever runs beside them (the model before).

With ``copy_waits_for_step`` a copy into a GPU slot (L1 -> L0) that starts while its replica's
step runs starts when that step ends: the real engine's slot fills and forwards take one lock
(``engine/factory.py``'s ``slot_lock``; ``runtime/tier_backends.py`` times the copy's stage from
before it takes the lock), so a load that reaches its copy mid-step waits out the forward, and
its request joins the step after the one planned meanwhile. Not a number: how loraplex's engine
is built, which ``sim calibrate`` writes true for every server it measures. A file without the
key reads as false: the copy runs beside the step, as before, results unchanged to the byte.

A fresh server process pays one-time work on its first requests that later ones do not (the
real server runs no warm-up: its first load from the store, first forward and first reply run
code and touch memory for the first time). ``first_load_s`` adds its seconds to a replica's
first L3 -> L2 stage (not scaled by ``load_busy_scale`` or the fleet's scales; with
``load_cpu_shared`` it is CPU the engine loses, as the stage's own price), ``first_step_s`` to
a replica's first step (a decode run does not repeat it), ``first_hop_s`` to the hop of the
run's first request (the front's first reply). Measured on a real single server's traces, each
run's first request against the same run's later ones (docs/simulator.md, simtail2); ``sim
calibrate --self`` measures them on the server it starts (``calibrate.fit_first``; ``--url``
writes 0). A file without the keys reads as 0: as before, to the byte.

A lone server's request whose hop starts while another request is in flight on it (arrived at
its front and not ended: the engine steps, the front streams the others' tokens) takes
``hop_busy_s`` seconds longer outside the engine than a lone one: the front's work for it (the
way in, the first token's way out) shares the CPU and the interpreter with the engine's steps
and the other requests' replies. ``sim calibrate --self`` measures it on its own server's
request log: the median time outside the engine (``ttft_s`` less ``first_step_end_s``) of its
requests that arrived while another was in flight less that of those that arrived alone
(``sim/calibrate.fit_hop_busy``; docs/simulator.md, simp50-p50). Charged on a lone server only (a
fleet's hops take ``fleet_contention``). A file without the key reads as 0: as before, to the
byte.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from loraplex.sim.cpu import Contention
from loraplex.sim.host_speed import HostProbe

SCHEMA = "loraplex-sim-cost/1"
LINKS = ("L3_to_L2", "L2_to_L1", "L1_to_L0")
HANDOFF_TIERS = ("L1", "L2", "L3")  # the tiers a waiting lease is loaded from
# A fresh server's one-time seconds (module docstring): its first fetch, its first request's
# hop, its first step
FIRST_KEYS = ("first_load_s", "first_hop_s", "first_step_s")
# Step keys a file may leave out (module docstring: the model before prefill was measured).
STEP_OPTIONAL = (
    "per_prefill_token_s",
    "per_byte_token_s",
    "per_revision_width_s",
    "per_prefill_step_s",
)


@dataclass(frozen=True)
class Link:
    """One tier-to-tier move: a fixed per-load cost plus bytes over bandwidth."""

    fixed_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        _non_negative("Link.fixed_s", self.fixed_s)
        if not (self.bytes_per_s > 0 and math.isfinite(self.bytes_per_s)):
            raise ValueError(f"Link.bytes_per_s must be finite and > 0, got {self.bytes_per_s!r}")

    def seconds(self, nbytes: int) -> float:
        return self.fixed_s + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class StepCost:
    """Engine step time as a linear function of the batch's work (module docstring)."""

    step_fixed_s: float
    per_token_s: float  # per decode token
    per_revision_s: float
    per_rank_token_s: float
    # Per prompt token; None: a model fitted before prefill was measured, prompt tokens cost
    # per_token_s (the old single-token-term model, exactly).
    per_prefill_token_s: float | None = None
    # Per token per byte of its adapter's weights, and per distinct revision per byte of one
    # rank of it (module docstring); None: a model fitted before they were measured, unpriced.
    per_byte_token_s: float | None = None
    per_revision_width_s: float | None = None
    # Once per step holding prompt tokens (module docstring); None: a model fitted before it
    # was measured on the engine's timeline, uncharged.
    per_prefill_step_s: float | None = None

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None:  # only the STEP_OPTIONAL terms may be None
                _non_negative(f"StepCost.{name}", value)

    @property
    def prices_weights(self) -> bool:
        """Whether the price reads adapter bytes (``byte_tokens``, ``revision_widths``)."""
        return self.per_byte_token_s is not None or self.per_revision_width_s is not None

    def seconds(
        self,
        decode_tokens: int,
        prefill_tokens: int,
        revisions: int,
        rank_tokens: int,
        *,
        byte_tokens: int = 0,
        revision_widths: float = 0.0,
    ) -> float:
        if self.per_prefill_token_s is None:
            tokens_s = self.per_token_s * (decode_tokens + prefill_tokens)
        else:
            tokens_s = self.per_token_s * decode_tokens + self.per_prefill_token_s * prefill_tokens
        step_s = (
            self.step_fixed_s
            + tokens_s
            + self.per_revision_s * revisions
            + self.per_rank_token_s * rank_tokens
        )
        if self.per_byte_token_s is not None:
            step_s += self.per_byte_token_s * byte_tokens
        if self.per_revision_width_s is not None:
            step_s += self.per_revision_width_s * revision_widths
        if self.per_prefill_step_s is not None and prefill_tokens > 0:
            step_s += self.per_prefill_step_s
        return step_s

    def to_dict(self) -> dict[str, float]:
        """The file's ``step`` object: every term set (no null for an absent optional term)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class CostModel:
    """Everything the simulator charges time for; one file per hardware profile."""

    hardware: str
    validated: bool
    step: StepCost
    links: dict[str, Link]
    # Per-request overheads outside the engine step: the front process (parse, auth, resolve),
    # the front<->engine hop, and in a fleet the ingress<->replica hop.
    front_s: float = 0.0
    ipc_s: float = 0.0
    network_s: float = 0.0
    # The loader and the engine share one CPU (a CPU-only server: torch_threads 1 and the GIL):
    # a load stage that starts while a step runs delays the engine's next step by its seconds.
    load_cpu_shared: bool = False
    # Quantiles at evenly spaced probabilities 0..1 of a request's extra hop seconds (a lone
    # warm request's TTFT less its group's median; may be negative); (): every hop the same.
    hop_jitter_s: tuple[float, ...] = ()
    # The same for a fleet's hop (front + IPC + network); (): a fleet draws from hop_jitter_s.
    network_jitter_s: tuple[float, ...] = ()
    # A fleet replica's step and load-stage time over a lone server's (co-location); 1: same.
    fleet_cpu_scale: float = 1.0
    # A fleet replica's load-stage time over a lone server's, measured on lone cold requests
    # through the fleet (module docstring); None: fleet_cpu_scale prices the loads too.
    fleet_load_scale: float | None = None
    # CPU cores the deployment's processes share (module docstring); None: no contention term.
    cores: int | None = None
    # A fleet's measured slowdown by requests in flight (module docstring); None: not measured.
    fleet_contention: Contention | None = None
    # Seconds a lease that waited for a load from a tier (L1, L2, L3) reaches its request after
    # the load completes (module docstring); {}: at once.
    lease_handoff_s: dict[str, float] = field(default_factory=dict)
    # Seconds a lease that misses the GPU slots holds the engine thread beyond a hit's, before
    # its load is submitted (module docstring); 0: none (inside lease_handoff_s).
    lease_ask_s: float = 0.0
    # The host's speed when the figures were measured (``sim/host_speed.py``); None: not
    # probed, and a run on another host speed cannot be rescaled.
    host_probe: HostProbe | None = None
    # A load stage before the copy (L3 -> L2, L2 -> L1) that starts while the engine has requests
    # running costs this times its price (module docstring); 1: its lone price.
    load_busy_scale: float = 1.0
    # A copy into a GPU slot that starts while a step runs starts when the step ends (the slot
    # lock; module docstring); False: the copy runs beside the step.
    copy_waits_for_step: bool = False
    # Seconds a replica's first L3 -> L2 stage takes beyond its price (a fresh process's one-time
    # work; module docstring); 0: none.
    first_load_s: float = 0.0
    # Seconds the run's first request's hop takes beyond its draw (the front's first reply;
    # module docstring); 0: none.
    first_hop_s: float = 0.0
    # Seconds a replica's first step takes beyond its price (its first forward; module
    # docstring); 0: none.
    first_step_s: float = 0.0
    # Seconds a lone server's request's hop takes beyond its draw when another request is in
    # flight on the server at its arrival (module docstring); 0: none.
    hop_busy_s: float = 0.0
    # Where each number comes from: a calibration run (command, date, machine) or a citation.
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.hardware:
            raise ValueError("CostModel.hardware must name the hardware profile")
        missing = [name for name in LINKS if name not in self.links]
        if missing:
            raise ValueError(f"CostModel.links is missing {missing}; expected {list(LINKS)}")
        unknown = sorted(set(self.links) - set(LINKS))
        if unknown:
            raise ValueError(f"CostModel.links has unknown links {unknown}; expected {list(LINKS)}")
        for name in ("front_s", "ipc_s", "network_s", "lease_ask_s", "hop_busy_s", *FIRST_KEYS):
            _non_negative(f"CostModel.{name}", getattr(self, name))
        _check_quantiles("CostModel.hop_jitter_s", self.hop_jitter_s)
        _check_quantiles("CostModel.network_jitter_s", self.network_jitter_s)
        for name in ("fleet_cpu_scale", "load_busy_scale"):
            scale = getattr(self, name)
            if not (scale > 0 and math.isfinite(scale)):
                raise ValueError(f"CostModel.{name} must be finite and > 0, got {scale!r}")
        load_scale = self.fleet_load_scale
        if load_scale is not None and not (load_scale > 0 and math.isfinite(load_scale)):
            raise ValueError(
                f"CostModel.fleet_load_scale must be finite and > 0, got {load_scale!r}"
            )
        if self.cores is not None and (isinstance(self.cores, bool) or self.cores < 1):
            raise ValueError(f"CostModel.cores must be None or an integer >= 1, got {self.cores!r}")
        wrong = sorted(set(self.lease_handoff_s) - set(HANDOFF_TIERS))
        if wrong:
            raise ValueError(
                f"CostModel.lease_handoff_s has unknown tiers {wrong}; expected {HANDOFF_TIERS}"
            )
        for tier, seconds in self.lease_handoff_s.items():
            _non_negative(f"CostModel.lease_handoff_s.{tier}", seconds)
        if not self.validated and not self.sources:
            raise ValueError(
                f"CostModel {self.hardware!r} is unvalidated and cites no sources: "
                "every hand-written number must say where it comes from"
            )

    def hop_jitter(self, u: float, fleet: bool = False) -> float:
        """The extra hop seconds at probability ``u`` in [0, 1): ``hop_jitter_s`` (a fleet's:
        ``network_jitter_s`` when given) interpolated linearly between its quantiles; 0 without
        them."""
        points = self.network_jitter_s if fleet and self.network_jitter_s else self.hop_jitter_s
        if not points:
            return 0.0
        at = u * (len(points) - 1)
        low = min(int(at), len(points) - 2)
        return points[low] + (at - low) * (points[low + 1] - points[low])

    def to_json(self) -> str:
        body = {"schema": SCHEMA, **asdict(self), "step": self.step.to_dict()}
        # A file without these keys reads as it did before they existed.
        for key, default in (
            ("hop_jitter_s", ()),
            ("network_jitter_s", ()),
            ("fleet_cpu_scale", 1.0),
            ("cores", None),
            ("fleet_contention", None),
            ("lease_handoff_s", {}),
            ("host_probe", None),
            ("load_busy_scale", 1.0),
            ("lease_ask_s", 0.0),
            ("fleet_load_scale", None),
            ("copy_waits_for_step", False),
            ("hop_busy_s", 0.0),
            *((key, 0.0) for key in FIRST_KEYS),
        ):
            if body[key] == default:
                del body[key]
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    def save(self, path: Path) -> None:
        path.write_text(self.to_json())


def load(path: Path) -> CostModel:
    """Read a cost-model file; a wrong schema or a missing/unknown key is a ValueError naming it."""
    body = json.loads(path.read_text())
    return from_dict(body, origin=str(path))


def from_dict(body: dict[str, object], origin: str = "<dict>") -> CostModel:
    if body.get("schema") != SCHEMA:
        raise ValueError(f"{origin}: schema must be {SCHEMA!r}, got {body.get('schema')!r}")
    known = {"schema", "hardware", "validated", "step", "links", "front_s", "ipc_s"}
    known |= {"network_s", "sources", "load_cpu_shared", "hop_jitter_s", "network_jitter_s"}
    known |= {"fleet_cpu_scale", "cores", "lease_handoff_s", "fleet_contention", "host_probe"}
    known |= {"load_busy_scale", "lease_ask_s", "fleet_load_scale", "copy_waits_for_step"}
    known |= {"hop_busy_s", *FIRST_KEYS}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"{origin}: unknown keys {unknown}")
    step = body.get("step")
    links = body.get("links")
    if not isinstance(step, dict) or not isinstance(links, dict):
        raise ValueError(f"{origin}: 'step' and 'links' must be objects")
    sources = body.get("sources", {})
    if not isinstance(sources, dict):
        raise ValueError(f"{origin}: 'sources' must be an object")
    shared = body.get("load_cpu_shared", False)
    if not isinstance(shared, bool):
        raise ValueError(f"{origin}: load_cpu_shared must be true or false, got {shared!r}")
    copy_waits = body.get("copy_waits_for_step", False)
    if not isinstance(copy_waits, bool):
        raise ValueError(f"{origin}: copy_waits_for_step must be true or false, got {copy_waits!r}")
    cores = body.get("cores")
    if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool)):
        raise ValueError(f"{origin}: cores must be an integer, got {cores!r}")
    return CostModel(
        hardware=str(body.get("hardware", "")),
        validated=bool(body.get("validated", False)),
        step=StepCost(**_numbers(step, StepCost, f"{origin}: step", STEP_OPTIONAL)),
        links={
            str(name): Link(**_numbers(link, Link, f"{origin}: links.{name}", ()))
            for name, link in links.items()
        },
        front_s=_float(body, "front_s"),
        ipc_s=_float(body, "ipc_s"),
        network_s=_float(body, "network_s"),
        load_cpu_shared=shared,
        hop_jitter_s=_number_list(body.get("hop_jitter_s", []), f"{origin}: hop_jitter_s"),
        network_jitter_s=_number_list(
            body.get("network_jitter_s", []), f"{origin}: network_jitter_s"
        ),
        fleet_cpu_scale=_float(body, "fleet_cpu_scale", 1.0),
        fleet_load_scale=None
        if body.get("fleet_load_scale") is None
        else _float(body, "fleet_load_scale"),
        cores=cores,
        fleet_contention=_contention(body.get("fleet_contention"), f"{origin}: fleet_contention"),
        lease_handoff_s=_handoffs(body.get("lease_handoff_s", {}), f"{origin}: lease_handoff_s"),
        host_probe=_host_probe(body.get("host_probe"), f"{origin}: host_probe"),
        load_busy_scale=_float(body, "load_busy_scale", 1.0),
        lease_ask_s=_float(body, "lease_ask_s", 0.0),
        copy_waits_for_step=copy_waits,
        hop_busy_s=_float(body, "hop_busy_s", 0.0),
        **{key: _float(body, key, 0.0) for key in FIRST_KEYS},
        sources={str(k): str(v) for k, v in sources.items()},
    )


def _numbers(body: object, kind: type, where: str, optional: tuple[str, ...]) -> dict[str, float]:
    """An object's numeric fields for ``kind``, refusing unknown or missing keys by name
    (``optional`` ones may be missing: the field's default then holds)."""
    if not isinstance(body, dict):
        raise ValueError(f"{where} must be an object")
    expected = {f.name for f in fields(kind)}
    unknown = sorted(set(body) - expected)
    missing = sorted(expected - set(optional) - set(body))
    if unknown or missing:
        raise ValueError(
            f"{where}: unknown keys {unknown}, missing keys {missing}; expected "
            f"{sorted(expected)} ({sorted(optional)} optional)"
        )
    values: dict[str, float] = {}
    for key, value in body.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}.{key} must be a number, got {value!r}")
        values[key] = float(value)
    return values


def _contention(value: object, where: str) -> Contention | None:
    """``fleet_contention``: absent (None), or ``{"in_flight": [...], "stretch": [...]}``."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"in_flight", "stretch"}:
        raise ValueError(f"{where} must be an object of in_flight and stretch, got {value!r}")
    counts = value["in_flight"]
    if not isinstance(counts, list) or not all(
        isinstance(k, int) and not isinstance(k, bool) for k in counts
    ):
        raise ValueError(f"{where}.in_flight must be a list of integers, got {counts!r}")
    stretch = _number_list(value["stretch"], f"{where}.stretch")
    return Contention(tuple(counts), stretch)


def _host_probe(value: object, where: str) -> HostProbe | None:
    """``host_probe``: absent (None), or ``{"matmul_s": ..., "loop_s": ...}``."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"matmul_s", "loop_s"}:
        raise ValueError(f"{where} must be an object of matmul_s and loop_s, got {value!r}")
    try:
        return HostProbe(value["matmul_s"], value["loop_s"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _handoffs(value: object, where: str) -> dict[str, float]:
    """``lease_handoff_s``: an object of tier -> seconds (tiers ``HANDOFF_TIERS``)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object of tier -> seconds, got {value!r}")
    return _numbers(value, _Handoffs, where, HANDOFF_TIERS)


@dataclass(frozen=True)
class _Handoffs:
    """The keys ``lease_handoff_s`` may hold (each optional)."""

    L1: float = 0.0
    L2: float = 0.0
    L3: float = 0.0


def _number_list(value: object, where: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        raise ValueError(f"{where} must be a list of numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _check_quantiles(name: str, points: tuple[float, ...]) -> None:
    if len(points) == 1 or not all(math.isfinite(v) for v in points):
        raise ValueError(f"{name} {list(points)} is invalid; expected none or >= 2 finite numbers")
    if any(b < a for a, b in itertools.pairwise(points)):
        raise ValueError(f"{name} {list(points)} is invalid; expected quantiles in ascending order")


def _float(body: dict[str, object], key: str, default: float = 0.0) -> float:
    value = body.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
