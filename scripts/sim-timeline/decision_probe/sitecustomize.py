"""An investigation probe, not part of loraplex: every ``Router.choose`` of a process, logged.

Put this directory first on ``PYTHONPATH`` and set ``LORAPLEX_PROBE_DECISIONS`` to a file
path: every Python process started with that environment (a ``bench sim`` run's Ray workers
inherit it: the cluster is ``ray.init(address="local")`` in the driver) wraps
``loraplex.router.router.Router.choose`` and appends one JSON line per call (``pid``, the
router clock's ``now_s``, the request's tenant and adapter key, ``retry``: a choice Ray asked
again, the chosen replica and reason, and per offered replica its report's age, the key's tier
there and its load; ``clock``: the router's clock's class, ``ManualClock`` in a simulator, which
is how ``fleet_decisions.py`` tells the driver's own simulations from the fleet now that both
name replicas ``rank-0``, ..). Unset: nothing is wrapped. The fleet's ingress is the one process
whose router decides the generate calls (cache calls go to a named replica without a choice).
"""

from __future__ import annotations

import contextlib
import json
import os

_PATH = os.environ.get("LORAPLEX_PROBE_DECISIONS")


def _install(path: str) -> None:
    from probe_views import replica_view  # this directory is on the path: the module docstring

    from loraplex.router import router as router_module

    choose = router_module.Router.choose

    def logged(self, request, replicas, *, replaces=None):  # type: ignore[no-untyped-def]
        decision = choose(self, request, replicas, replaces=replaces)
        now_s = self._clock.now()
        views = {}
        for replica_id, report in replicas.items():
            views[replica_id] = replica_view(report, request.adapter_key, now_s)
            views[replica_id]["l0"] = None if report is None else sorted(report.residency.l0)
        line = {
            "pid": os.getpid(),
            "now_s": round(now_s, 6),
            "tenant": request.tenant,
            "adapter": request.adapter_key,
            "retry": replaces is not None,
            "clock": type(self._clock).__name__,
            "chosen": decision.replica_id,
            "reason": decision.reason.value,
            "replicas": views,
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        return decision

    router_module.Router.choose = logged  # type: ignore[method-assign]


if _PATH:
    with contextlib.suppress(ImportError):  # a process without loraplex on its path
        _install(_PATH)
