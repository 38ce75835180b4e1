"""The scale run (issue 30: 1,000,000 requests over 10,000 adapters and 64 replicas) in a child
process: the benchmark's own process holds torch, Ray and the real runs' buffers, which would
count in a peak RSS read there. The child runs ``sim.call.scale_metrics`` alone and prints its
dict as one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from loraplex.sim.cost_model import CostModel

_CHILD = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from loraplex.sim.call import scale_metrics\n"
    "from loraplex.sim.cost_model import load\n"
    "requests, adapters, replicas = (int(v) for v in sys.argv[1:4])\n"
    "out = scale_metrics(requests, adapters, replicas, load(Path(sys.argv[4])))\n"
    "print(json.dumps(out))\n"
)
TIMEOUT_S = 1800.0  # the bound is 60 s; a run ten times slower still reports


def scale_in_child(
    requests: int, adapters: int, replicas: int, cost_model: CostModel
) -> dict[str, Any]:
    """The child's dict, with its keys prefixed ``scale_`` except the headline
    ``sim_seconds_...`` key, which stays as the core names it."""
    with tempfile.TemporaryDirectory(prefix="loraplex-sim-scale-") as tmp:
        path = Path(tmp) / "cost.json"
        cost_model.save(path)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(requests), str(adapters), str(replicas), str(path)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the scale run failed ({done.returncode}): {done.stderr[-2000:]}")
    body: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {k if k.startswith("sim_seconds_") else f"scale_{k}": v for k, v in body.items()}
