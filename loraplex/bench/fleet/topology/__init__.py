"""``loraplex bench fleet --topology``: issue 28's fleet topology measured on a real fleet.

``config.py`` (the two sides, ``TopologyBenchConfig``), ``traces.py`` (the ``skewed80`` and
``uniform16`` traces over 16 revisions), ``bench.py`` (``run_topology_bench``: the runs on a
real fleet, in ABBA order), ``poller.py`` (the merges and the first ``merged`` decision seen
during a run), ``report.py`` (figures, headline ratios per repeat pair, the probe check, the
table).
"""

from loraplex.bench.fleet.topology.bench import run_topology_bench
from loraplex.bench.fleet.topology.config import SIDES, TOPOLOGY, UNMERGED, TopologyBenchConfig
from loraplex.bench.fleet.topology.poller import Timeline
from loraplex.bench.fleet.topology.report import (
    SideRun,
    probe_check,
    tokens_per_s,
    topology_metrics,
    topology_table,
)
from loraplex.bench.fleet.topology.traces import hot_token_share, revisions, topology_trace

__all__ = [
    "SIDES",
    "TOPOLOGY",
    "UNMERGED",
    "SideRun",
    "Timeline",
    "TopologyBenchConfig",
    "hot_token_share",
    "probe_check",
    "revisions",
    "run_topology_bench",
    "tokens_per_s",
    "topology_metrics",
    "topology_table",
    "topology_trace",
]
