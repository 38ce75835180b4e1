"""Replica selection for a fleet of engine replicas (torch-free, Ray-free).

``Router.choose(request, replicas)`` ranks replica ids from their latest ``ReplicaReport`` and
the router's own recent decisions, under a named policy (``policy_names()``); see
docs/router.md.
"""

from loraplex.router.bloom import BloomFilter
from loraplex.router.config import RouterConfig
from loraplex.router.decision import Decision, Reason, RouteRequest, RoutingPolicy
from loraplex.router.reports import (
    MalformedReportError,
    ReplicaLoad,
    ReplicaReport,
    Residency,
    decode_report,
    encode_report,
)
from loraplex.router.router import DEFAULT_POLICY, Router, policy_names, register_policy
from loraplex.router.view import ReplicaView, Tier

__all__ = [
    "DEFAULT_POLICY",
    "BloomFilter",
    "Decision",
    "MalformedReportError",
    "Reason",
    "ReplicaLoad",
    "ReplicaReport",
    "ReplicaView",
    "Residency",
    "RouteRequest",
    "Router",
    "RouterConfig",
    "RoutingPolicy",
    "Tier",
    "decode_report",
    "encode_report",
    "policy_names",
    "register_policy",
]
