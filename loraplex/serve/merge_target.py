"""``mode = "merged:<tenant/name@revision>"`` at a server's start: a revision the registry does
not hold is merged by no engine until it is registered and asked for. That is said once, as a
WARNING naming ``mode``, not refused: the operator may register the revision after the start.
NOTE: it was served unmerged in silence (a mistyped name merged nothing, and nothing said so)."""

from __future__ import annotations

import logging

from loraplex.engine.mode_policy import ModeSetting
from loraplex.errors import AdapterNotFoundError
from loraplex.registry import Registry

_log = logging.getLogger(__name__)


def warn_if_unregistered(mode: str, registry: Registry) -> bool:
    """True, after one WARNING line, when ``mode`` merges a revision ``registry`` lacks."""
    ref = ModeSetting.parse(mode).revision
    if ref is None:
        return False
    try:
        registry.get_revision(ref)
    except AdapterNotFoundError:
        _log.warning(
            "mode %s: no revision %s is registered; nothing is merged until it is registered "
            "and requested",
            mode,
            ref,
        )
        return True
    return False
