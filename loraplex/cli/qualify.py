"""``loraplex qualify``: the qualification matrix against a running deployment (``--url`` and
its admin key) or a server of its own (``--self``); docs/qualification.md.

Exit 0 when every cell passed, 1 when a cell failed, 2 when the run could not be made (a bad
plan, an unreachable deployment, a refused setup)."""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from loraplex.cli.locations import DataDir
from loraplex.cli.preflight import _admin_key, key_file_hint, refuse_with_self
from loraplex.cli.url_option import base_url
from loraplex.registry import default_data_dir

if TYPE_CHECKING:
    from loraplex.qualify.plan import QualifyPlan
    from loraplex.qualify.report import QualifyReport

Opt = typer.Option
DEFAULT_ASSETS = Path(".loraplex-assets/test-small")  # the checkout's generated small demo set
SERVED_DEMO_DIR = "demo-assets"  # NOTE: where serve/assembly.py keeps the demo set it serves


def register(app: typer.Typer) -> None:
    app.command("qualify")(qualify_command)


def qualify_command(
    url: Annotated[
        str | None, Opt(help="Base URL of the server or fleet ingress.", parser=base_url)
    ] = None,
    *,
    admin_key: Annotated[
        str | None, Opt(envvar="LORAPLEX_ADMIN_KEY", help="Admin credential (default: data dir).")
    ] = None,
    data_dir: DataDir = None,
    self_serve: Annotated[
        bool, Opt("--self", help="Start a loraplex serve of its own (demo assets) and qualify it.")
    ] = False,
    plan: Annotated[
        Path | None, Opt(help="Plan file (TOML or JSON); default: the defaults.")
    ] = None,
    quick: Annotated[bool, Opt("--quick", help="Covering design over 1 and 16 adapters.")] = False,
    json_output: Annotated[bool, Opt("--json", help="Print the report as one JSON line.")] = False,
    report_dir: Annotated[
        Path, Opt(help="Where report.json, report.html, adapters and logs go.")
    ] = Path("qualify-reports"),
    assets: Annotated[
        Path | None,
        Opt(
            help="Demo assets the deployment serves (base model for references); default: "
            "with --url the data dir's demo-assets, with --self .loraplex-assets/test-small."
        ),
    ] = None,
    preset: Annotated[str, Opt(help="The demo preset of --assets.")] = "small",
) -> None:
    """Run the qualification matrix: four checks per answer, cost per correct request."""
    from loraplex.cli.assets import check_preset
    from loraplex.qualify.client import QualifyError
    from loraplex.qualify.plan import PlanError, load_plan
    from loraplex.qualify.plan import quick as quick_plan

    if self_serve == (url is not None):
        raise typer.BadParameter("give exactly one of --url and --self", param_hint="--url")
    if self_serve:  # NOTE: both were silently ignored with --self
        refuse_with_self(admin_key, data_dir)
    check_preset(preset)
    assets = assets or _default_assets(self_serve, data_dir)
    _refuse_another_preset(preset, assets, self_serve)
    try:
        loaded = load_plan(plan)
    except PlanError as exc:
        raise typer.BadParameter(str(exc), param_hint="--plan") from None
    loaded = quick_plan(loaded) if quick else loaded
    run_dir = report_dir / time.strftime("%Y%m%dT%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = _run(
            loaded, url, admin_key=admin_key, data_dir=data_dir, assets=assets, preset=preset,
            run_dir=run_dir, quick=quick,
        )  # fmt: skip
    except (QualifyError, RuntimeError, OSError) as exc:
        status = exc.status if isinstance(exc, QualifyError) and url is not None else None
        typer.echo(f"qualify: {exc}{key_file_hint(status, admin_key, data_dir)}", err=True)
        raise typer.Exit(2) from None
    typer.echo(report.json_line() if json_output else _summary(report.payload, run_dir))
    from loraplex.qualify.html import render  # after the report is out: plotting is slow

    (run_dir / "report.html").write_text(render(report), encoding="utf-8")
    raise typer.Exit(report.exit_code())


def _refuse_another_preset(preset: str, assets: Path, self_serve: bool) -> None:
    """``--preset`` must be the preset of the set the deployment serves: the comparators load
    ``--assets`` with it and refuse a set of another preset. NOTE: it was not checked, so a run
    with the wrong one (``--self --preset large``: ``--self`` serves the small set) qualified
    every cell and then failed every comparator on it, each ratio null."""
    import json

    from loraplex.demo.manifest import MANIFEST_NAME
    from loraplex.serve.assembly import DEMO_PRESET

    if self_serve and preset != DEMO_PRESET:
        raise typer.BadParameter(
            f"{preset!r} is not the preset --self serves ({DEMO_PRESET!r})", param_hint="--preset"
        )
    if not (assets / MANIFEST_NAME).is_file():
        return  # --self generates it; with --url, the missing base model is refused later
    try:
        own = json.loads((assets / MANIFEST_NAME).read_text(encoding="utf-8"))["preset"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a demo set's manifest: refused later, naming --assets
    if own != preset:
        raise typer.BadParameter(
            f"{preset!r} is not the preset of --assets {assets} ({own!r})", param_hint="--preset"
        )


def _default_assets(self_serve: bool, data_dir: Path | None) -> Path:
    """``--self``: the checkout's test set; ``--url``: the demo set ``loraplex serve`` on its
    defaults serves from the data directory. NOTE: both used to be the checkout-relative test
    set, so a qualify run from the operator's own directory found no base model there."""
    if self_serve:
        return DEFAULT_ASSETS
    return (data_dir or default_data_dir(os.environ, Path.home())) / SERVED_DEMO_DIR


def _say_generation(out: Path) -> None:
    typer.echo(
        f"generating the demo model and adapters into {out} (first run only; a few minutes on "
        "a small CPU machine), before the server starts",
        err=True,
    )


def _run(
    plan: QualifyPlan, url: str | None, *, admin_key: str | None, data_dir: Path | None,
    assets: Path, preset: str, run_dir: Path, quick: bool,
) -> QualifyReport:  # fmt: skip
    from loraplex.qualify.run import Deployment, qualify
    from loraplex.qualify.selfserve import self_server

    with ExitStack() as stack:
        if url is None:
            server = stack.enter_context(self_server(assets, run_dir, announce=_say_generation))
            url, key = server.url, server.admin_key
        else:
            key = _admin_key(admin_key, data_dir)
        where = Deployment(
            url,
            key,
            assets.resolve(),
            preset,
            run_dir,
            run_dir.parent / f"adapters-{preset}",
            quick,
        )
        report = qualify(plan, where)
    (run_dir / "report.json").write_text(report.json_line() + "\n", encoding="utf-8")
    return report


def _summary(payload: dict[str, Any], run_dir: Path) -> str:
    failed = payload["failed_cells"]
    lines = [f"{payload['num_cells']} cells, {len(failed)} failed; report in {run_dir}"]
    lines += [
        f"  FAIL {c['cell_id']}: {'; '.join(c['reasons'])}"
        for c in payload["cells"]
        if not c["passed"]
    ]
    lines += _comparator_failures(payload["cells"])
    lines += [_cell_cost(cell) for cell in payload["cells"]]
    lines.append(f"headline: {json.dumps(payload['headline'], sort_keys=True)}")
    return os.linesep.join(lines)


def _cell_cost(cell: dict[str, Any]) -> str:
    """One cell's correct requests and each method's cost per correct request, the figure the run
    is for. NOTE: the summary printed only the headline's ratios (as a Python dict: None for
    null), all three null in a ``--quick`` run, so it never said what a correct answer cost;
    the costs were only in report.json (newop4)."""
    costs = []
    for method, result in cell.get("methods", {}).items():
        cost = result.get("cost_per_correct_request") if isinstance(result, dict) else None
        costs.append(f"{method} {'null' if cost is None else f'{cost:.3g}'}")
    correct, sent = cell.get("correct_requests"), cell.get("requests")
    return (
        f"  cell {cell['cell_id']}: {correct} of {sent} requests correct; USD per correct "
        f"request: {', '.join(costs) or 'none'}"
    )


def _comparator_failures(cells: list[dict[str, Any]]) -> list[str]:
    """One line per comparator that failed in some cell (its ratios are null there), with the
    first reason. NOTE: the summary said nothing, so every ratio read null for no stated reason
    (the reasons were only in report.json)."""
    failed: dict[str, list[str]] = {}
    for cell in cells:
        for method, result in cell["methods"].items():
            if isinstance(result, dict) and result.get("status") == "failed":
                failed.setdefault(method, []).append(str(result.get("reason", "")))
    return [
        f"  comparator {method} failed in {len(reasons)} of {len(cells)} cells (its ratios are "
        f"null there): {' '.join(reasons[0].split())[:400] or 'no reason given'}"
        for method, reasons in failed.items()
    ]
