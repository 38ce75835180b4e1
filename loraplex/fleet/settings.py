"""``FleetSettings``: what every deployment of a fleet is built from (pickled by Ray).

The engine replicas and the ingress run with ``serve``'s configuration (``ServeConfig``: the
same keys, the same meaning) plus the fleet's own: how many replicas of each, the routing policy
and its settings, how often replicas report. The ingress listens with loraplex's own listener
(``listener.py``), so every listener key of ``serve`` holds. Keys of ``ServeConfig`` that a fleet
cannot honour (each replica runs its engine on a thread of its own process) are refused by
``check_fleet_config`` when set to anything but their default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from loraplex.router.router import (
    DEFAULT_POLICY,
    follows_dedication,
    policy_names,
    router_config,
)
from loraplex.router.topology import TopologyConfig
from loraplex.serve.config import ServeConfig
from loraplex.serve.config.keys import NOT_IN_FLEET

APP_NAME = "loraplex"  # the Serve application
DEFAULT_REPORT_PERIOD_S = 0.5  # replicas' routing stats period (the issue asks for <= 1 s)
MAX_REPORT_PERIOD_S = 1.0
# A replica whose latest report is this many report periods old leaves the rotation (its process
# is frozen or unreachable: Ray Serve keeps handing the router its last routing stats, which say
# "up", until its own health check gives up, after 3 × 10 s).
STALE_REPORT_PERIODS = 6
MIN_STALE_REPORT_PERIODS = 2  # a tighter bound would take healthy replicas out between reports
MAX_STALE_AFTER_S = 60.0  # the board forgets a replica silent this long (``board.FORGET_AFTER_S``)
# The fleet's own keys, as a user writes them: a ``[fleet]`` table of ``fleet up --config`` and
# the ``args`` of ``loraplex.fleet.app:build`` (next to serve's keys). Each names the
# FleetSettings field it sets, but ``replicas`` (``engine_replicas``); a test keeps the two true.
FLEET_KEYS = (
    "replicas",
    "policy",
    "seed",
    "report_period_s",
    "stale_after_s",
    "router",
    "topology",
    "engine_resource",
)
_TOPOLOGY_KEYS = sorted(f.name for f in fields(TopologyConfig))
# A Ray custom resource name; Ray's own (and ``node:<id>``) are not the operator's to hand out.
RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass(frozen=True)
class FleetSettings:
    serve: ServeConfig  # every replica's engine settings and the ingress's HTTP settings
    model_dir: Path  # the base model (the demo model when ``serve.model`` is None)
    engine_replicas: int = 2  # engine replicas (one engine, slot pool, CPU tier, disk cache each)
    ingress_replicas: int = 1  # ingress replicas (HTTP, auth, resolution, release controller)
    policy: str = DEFAULT_POLICY  # routing policy (``loraplex.router``)
    router: dict[str, Any] = field(default_factory=dict)  # RouterConfig fields to override
    seed: int | None = None  # the router's random choices; None: unseeded
    report_period_s: float = DEFAULT_REPORT_PERIOD_S  # replicas' routing stats period
    # a replica whose latest report (to the router, or status to the board) is older than this
    # leaves the rotation until fresh ones resume; None: STALE_REPORT_PERIODS × report_period_s
    stale_after_s: float | None = None
    # TopologyConfig fields (router/topology.py): one replica dedicated to a revision that
    # would fill one; None: no dedication (each replica's own ``mode`` decides alone)
    topology: dict[str, Any] | None = None
    # a Ray custom resource each engine replica asks one unit of, so engines run only on the Ray
    # nodes that advertise it (a RayService's engine workers, never its head); None: any node
    engine_resource: str | None = None

    def __post_init__(self) -> None:
        for name in ("engine_replicas", "ingress_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                # named as users set it (``--replicas``, the [fleet] key ``replicas``)
                label = "replicas" if name == "engine_replicas" else name
                raise ValueError(f"{label} {value!r} is invalid; expected an int >= 1")
        if self.ingress_replicas != 1:
            raise ValueError(
                f"ingress_replicas {self.ingress_replicas} is invalid; expected 1 (the release "
                "controller and its traffic windows live in the one ingress)"
            )
        self._check_routing()
        self._check_stale_after()
        self._check_engine_resource()
        check_fleet_config(self.serve)

    @property
    def stale_bound_s(self) -> float:
        """The bound in force: ``stale_after_s``, or its default from the report period."""
        if self.stale_after_s is None:
            return STALE_REPORT_PERIODS * self.report_period_s
        return float(self.stale_after_s)

    def _check_stale_after(self) -> None:
        value = self.stale_after_s
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"stale_after_s {value!r} is invalid; expected a number of seconds")
        low = MIN_STALE_REPORT_PERIODS * self.report_period_s
        if not low <= value <= MAX_STALE_AFTER_S:
            raise ValueError(
                f"stale_after_s {value} is invalid; expected >= {low:g} ({MIN_STALE_REPORT_PERIODS}"
                f" report periods) and <= {MAX_STALE_AFTER_S:g}"
            )

    def _check_engine_resource(self) -> None:
        value = self.engine_resource
        if value is None:
            return
        if (
            not isinstance(value, str)
            or not RESOURCE_NAME.fullmatch(value)
            or value in RAY_RESOURCES
        ):
            raise ValueError(
                f"engine_resource {value!r} is invalid; expected a Ray custom resource name "
                f"(letters, digits, '_'; a letter or '_' first; none of {RAY_RESOURCES})"
            )

    def _check_topology(self) -> None:
        if self.topology is None:
            return
        if not isinstance(self.topology, dict):
            raise ValueError(
                f"topology {self.topology!r} is invalid; expected a table of TopologyConfig keys"
            )
        unknown = sorted(str(k) for k in self.topology if k not in _TOPOLOGY_KEYS)
        if unknown:
            raise ValueError(
                f"topology keys {unknown} are unknown; expected some of {_TOPOLOGY_KEYS}"
            )
        topology = TopologyConfig(**self.topology)  # raises naming a wrong value
        if self.engine_replicas < topology.min_replicas:
            # NOTE: the replica count is fixed (Ray Serve's num_replicas; no autoscaling): a
            # fleet this small never reaches min_replicas, and its topology would never act
            raise ValueError(
                f"topology is set with replicas {self.engine_replicas}; expected replicas >= "
                f"its min_replicas {topology.min_replicas} (fewer dedicate none), or no "
                "topology table"
            )
        if self.serve.mode != "auto":
            raise ValueError(
                f"topology is set while the [serve] mode is {self.serve.mode!r}; expected mode "
                "'auto' (only an auto engine merges the revision its replica is dedicated to: "
                "another setting ignored the dedication while the router steered that "
                "revision's traffic to the replica as if merged), or no topology table"
            )
        if not follows_dedication(self.policy):
            raise ValueError(
                f"topology is set while the routing policy is {self.policy!r}, which does not "
                "send a dedicated revision's traffic to its replica (the replica would merge it "
                "and serve it no more often than any other); expected an affinity policy, or no "
                "topology table"
            )

    def _check_routing(self) -> None:
        if self.policy not in policy_names():
            raise ValueError(f"policy {self.policy!r} is invalid; expected one of {policy_names()}")
        if not isinstance(self.router, dict):
            raise ValueError(
                f"router {self.router!r} is invalid; expected a table of RouterConfig keys"
            )
        router_config(self.policy, self.router)  # raises naming a wrong key or value
        self._check_topology()
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed {seed!r} is invalid; expected an int or None")
        period = self.report_period_s
        if isinstance(period, bool) or not isinstance(period, int | float):
            raise ValueError(f"report_period_s {period!r} is invalid; expected a number of seconds")
        if not 0 < period <= MAX_REPORT_PERIOD_S:
            raise ValueError(
                f"report_period_s {period} is invalid; expected > 0 and <= {MAX_REPORT_PERIOD_S}"
            )


def check_fleet_config(config: ServeConfig) -> None:
    """Refuses ``serve`` keys a fleet would not read (set to anything but their default)."""
    defaults = ServeConfig(data_dir=config.data_dir)
    for name in NOT_IN_FLEET:
        if getattr(config, name) != getattr(defaults, name):
            raise ValueError(
                f"config key {name} is not used by a fleet (each engine replica runs its engine "
                "in its own process); remove it"
            )
