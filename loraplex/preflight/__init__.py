"""``loraplex preflight``: the seeds' 14-item launch checklist checked against a running
deployment (one server or a fleet ingress) from outside, as an operator reaches it: HTTP, the
admin API, ``/metrics`` and a short load test. Torch-free: it is a client.
"""

from loraplex.preflight.client import PreflightError
from loraplex.preflight.load import LoadConfig
from loraplex.preflight.report import ITEM_IDS, ITEMS, Report, Status, Verdict
from loraplex.preflight.run import PreflightConfig, preflight

__all__ = [
    "ITEMS",
    "ITEM_IDS",
    "LoadConfig",
    "PreflightConfig",
    "PreflightError",
    "Report",
    "Status",
    "Verdict",
    "preflight",
]
