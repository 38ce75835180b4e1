"""The self-contained HTML report: the headline, one row per cell, and three plots embedded as
base64 PNGs (cost per correct request per cell for the three methods, TTFT CDFs cold vs warm,
the four pass ratios per cell). matplotlib is imported only here, with the Agg backend."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from loraplex.qualify.report import QualifyReport

METHODS = ("loraplex", "separate", "in_context")
COLORS = {"loraplex": "tab:blue", "separate": "tab:orange", "in_context": "tab:green"}
CHECK_KEYS = ("correct_revision_ratio", "quality_ratio", "latency_ratio", "isolation_ratio")


def render(report: QualifyReport) -> str:
    cells = report.payload["cells"]
    images = [_cost_plot(cells), _ttft_plot(report), _ratio_plot(cells)]
    rows = "".join(_row(c) for c in cells)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ("cell", "passed", *CHECK_KEYS, *METHODS))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>loraplex qualify</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 6px}"
        "table{border-collapse:collapse}.fail{background:#fdd}</style></head><body>"
        f"<h1>loraplex qualify</h1><p>{html.escape(report.payload['url'])}: "
        f"{report.payload['num_cells']} cells, failed: "
        f"{html.escape(', '.join(report.payload['failed_cells']) or 'none')}</p>"
        f"<h2>Headline</h2><pre>{html.escape(json.dumps(report.payload['headline'], indent=1))}"
        "</pre>"
        + "".join(f"<img alt='plot' src='data:image/png;base64,{img}'>" for img in images)
        + f"<h2>Cells</h2><table><tr>{head}</tr>{rows}</table></body></html>"
    )


def _row(cell: dict[str, Any]) -> str:
    costs = [_method_cost(cell, m) for m in METHODS]
    values = [cell["cell_id"], cell["passed"], *(cell[k] for k in CHECK_KEYS), *costs]
    css = "" if cell["passed"] else " class='fail'"
    return f"<tr{css}>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in values) + "</tr>"


def _method_cost(cell: dict[str, Any], method: str) -> float | None:
    result = cell["methods"].get(method) or {}
    cost = result.get("cost_per_correct_request")
    return None if cost is None else float(cost)


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _png(pyplot: Any, fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    pyplot.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _cost_plot(cells: list[dict[str, Any]]) -> str:
    pyplot = _figure()
    from matplotlib import patches

    fig, ax = pyplot.subplots(figsize=(max(6, len(cells) * 0.12), 3.5))
    handles = []
    for offset, method in enumerate(METHODS):
        costs = [(i, _method_cost(c, method)) for i, c in enumerate(cells)]
        defined = [(i, cost) for i, cost in costs if cost]
        xs = [i + (offset - 1) * 0.27 for i, _ in defined]
        ax.bar(xs, [cost for _, cost in defined], width=0.27, color=COLORS[method])
        label = f"{method} ({len(defined)} of {len(cells)} cells defined)"
        handles.append(patches.Patch(color=COLORS[method], label=label))
    ax.legend(handles=handles)
    if any(_method_cost(c, m) for c in cells for m in METHODS):
        ax.set_yscale("log")  # NOTE: only with a bar: log-scaling an empty axis raises
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([str(i) for i in range(len(cells))], fontsize="x-small")
    ax.set_ylabel("USD per correct request")
    ax.set_xlabel("cell (report order); no bar: undefined")
    return _png(pyplot, fig)


def _ttft_plot(report: QualifyReport) -> str:
    pyplot = _figure()
    fig, ax = pyplot.subplots(figsize=(5, 3.5))
    warm = sorted(t for c in report.cells for t in c.verdict.ttft_warm_s)
    cold = sorted(t for c in report.cells for t in c.verdict.ttft_cold_s)
    for name, values in (("warm (L0)", warm), ("cold (L1-L3)", cold)):
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("share of answers")
    ax.legend()
    return _png(pyplot, fig)


def _ratio_plot(cells: list[dict[str, Any]]) -> str:
    pyplot = _figure()
    fig, ax = pyplot.subplots(figsize=(max(6, len(cells) * 0.12), 3.5))
    for key in CHECK_KEYS:
        ax.plot(range(len(cells)), [c[key] if c[key] is not None else float("nan") for c in cells],
                marker=".", linestyle="", label=key)  # fmt: skip
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("cell (report order)")
    ax.set_ylabel("pass ratio")
    ax.legend(fontsize="small")
    return _png(pyplot, fig)
