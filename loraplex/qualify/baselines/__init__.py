"""The comparators of ``loraplex qualify``: the same cell's traffic served by separate merged
deployments (one dense model per adapter) and by the base model with in-context examples,
measured on real servers and priced per correct request like loraplex itself
(docs/qualification.md, "Against separate deployments and in-context examples").

Torch-free: the servers and the PEFT merge run in subprocesses.
"""

from loraplex.qualify.baselines.in_context import measure_in_context
from loraplex.qualify.baselines.separate import measure_separate
from loraplex.qualify.baselines.types import (
    BaselineContext,
    CellTraffic,
    MethodResult,
    Probe,
)

__all__ = [
    "BaselineContext",
    "CellTraffic",
    "MethodResult",
    "Probe",
    "measure_in_context",
    "measure_separate",
]
