"""``KEY=NUMBER`` pairs of the simulator's command lines: ``sim run --topology-set`` and the
fleet's ``router`` table as ``sim run --router`` / ``plan --router`` (``SimConfig.router``)."""

from __future__ import annotations

from dataclasses import fields


def router_table(policy: str, pairs: list[str]) -> dict[str, int | float]:
    """``--router KEY=NUMBER`` pairs as the fleet's ``router`` table, checked as the fleet
    checks it (an unknown key, a bad value, a key ``policy`` does not read: named)."""
    from loraplex.router.config import RouterConfig
    from loraplex.router.router import policy_names, router_config

    table = number_pairs(pairs, RouterConfig, None)
    if policy in policy_names():  # else ``SimConfig`` refuses the policy, naming its flag
        router_config(policy, table)
    return table


def number_pairs(pairs: list[str], cls: type, keys: list[str] | None) -> dict[str, int | float]:
    """``KEY=NUMBER`` pairs of dataclass ``cls``'s fields: an integer where the field's default
    is one, else a number; a key not in ``keys`` is refused (None: left to ``cls``'s check)."""
    counts = {
        f.name
        for f in fields(cls)
        if isinstance(f.default, int) and not isinstance(f.default, bool)
    }
    values: dict[str, int | float] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key or (keys is not None and key not in keys):
            known = "" if keys is None else f", KEY one of {keys}"
            raise ValueError(f"{pair!r} is invalid; expected KEY=NUMBER{known}")
        try:
            values[key] = int(text) if key in counts else float(text)
        except ValueError:
            kind = "an integer" if key in counts else "a number"
            raise ValueError(f"{pair!r} is invalid; expected {kind} after '='") from None
    return values
