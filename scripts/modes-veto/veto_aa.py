"""A/A and A/B of the veto rule on recorded replay steps: main's StepCosts vs the branch's."""

import importlib.util
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType

from loraplex.engine.mode_policy import SLOWER_MARGIN

HERE = Path(__file__).resolve().parent


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


impls = {
    "main": load(str(HERE / "main_mode_costs.py"), "oldc").StepCosts,
    "branch": load(str(HERE.parents[1] / "loraplex/engine/mode_costs.py"), "newc").StepCosts,
}


def veto_at(cls, steps):
    sc = cls(min_steps=8)
    for i, (m, n, s) in enumerate(steps):
        sc.record(m, s, n)
        mlu, u = sc.merged_like_unmerged(), sc.per_token(False)
        if mlu is not None and u is not None and mlu > u * SLOWER_MARGIN:
            return i, round(mlu / u, 3)
    return None, None


def out(*parts: object, sep: str = " ") -> None:
    sys.stdout.write(sep.join(str(p) for p in parts) + "\n")


for path in sys.argv[1:]:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    ks = [
        next((i for i, st in enumerate(r["steps"]) if st[0]), 0)
        for r in rows
        if r["kind"] == "auto"
    ]
    K = int(statistics.median(ks))
    out(path, "pretend merge at", K, "in plain replays")
    tally = defaultdict(lambda: defaultdict(int))
    for r in rows:
        base = [(m, n, s) for m, n, s, _ in r["steps"]]
        cases = {}
        if r["kind"] == "auto":
            cases["auto"] = base
        else:
            cases["A/A"] = [(i >= K, n, s) for i, (m, n, s) in enumerate(base)]
            for f in (1.1, 1.2, 1.3, 1.5):
                cases[f"merged x{f}"] = [
                    (i >= K, n, s * (f if i >= K else 1)) for i, (m, n, s) in enumerate(base)
                ]
        for case, steps in cases.items():
            said = []
            for name, cls in impls.items():
                at, ratio = veto_at(cls, steps)
                tally[case][name] += at is not None
                tally[case]["n"] += name == "main"
                said.append(f"{name} veto@{at} {ratio}")
            out(r["rep"], r["kind"], case, *said, sep=" | ")
    for case, t in tally.items():
        out(case, dict(t))
