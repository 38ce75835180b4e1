"""What the simulated fleet's router knows replicas and revisions by, where a caller names them
(``simulate``'s ``replica_ids`` and ``adapter_keys``): a cold revision's placement is a hash of
the two (``router/placement.py``), so a simulation given a real fleet's names places as it does.
By default the replicas are ``rank-0``, .. (the real fleet's router's names: its replicas'
deployment ranks, docs/fleet.md, "Placement identity") and a revision's key carries a digest
derived from its names (``run.adapter_key``), which no served adapter has."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loraplex.artifacts.identity import AdapterKey

MAX_REPLICA_ID_CHARS = 128  # the longest replica id ``simulate`` takes


def check_replica_ids(ids: Sequence[str] | None, replicas: int) -> tuple[str, ...] | None:
    """``ids`` as a tuple, or a ValueError naming ``replica_ids``: one per replica, distinct,
    each a non-empty string of at most ``MAX_REPLICA_ID_CHARS`` characters."""
    if ids is None:
        return None
    out = tuple(ids)
    if len(out) != replicas:
        raise ValueError(f"replica_ids has {len(out)} ids; expected one per replica ({replicas})")
    for i in out:
        if not isinstance(i, str) or not 0 < len(i) <= MAX_REPLICA_ID_CHARS:
            raise ValueError(
                f"replica_ids {i!r} is invalid; expected a string of 1 to "
                f"{MAX_REPLICA_ID_CHARS} characters"
            )
    if len(set(out)) != len(out):
        raise ValueError(f"replica_ids {list(out)} is invalid; expected distinct ids")
    return out


def check_adapter_keys(
    keys: Mapping[tuple[str, str], AdapterKey] | None,
) -> dict[tuple[str, str], AdapterKey]:
    """``keys`` ((owner, ``name@revision`` or ``name``) -> the key a server serves it under) as
    a dict, or a ValueError naming ``adapter_keys``: each key an ``AdapterKey`` of that owner,
    and no two adapters under one key."""
    out = dict(keys or {})
    for where, key in out.items():
        if not isinstance(key, AdapterKey) or key.tenant != where[0]:
            raise ValueError(
                f"adapter_keys[{where!r}] {key!r} is invalid; expected the AdapterKey of "
                f"an adapter of {where[0]!r}"
            )
    if len(set(out.values())) != len(out):
        raise ValueError("adapter_keys is invalid; expected one key per adapter")
    return out
