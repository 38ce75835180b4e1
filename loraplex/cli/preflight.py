"""``loraplex preflight``: the launch checklist against a running deployment.

The admin key comes from ``--admin-key`` / ``LORAPLEX_ADMIN_KEY``, else from the data directory's
``admin-key`` file (where ``loraplex serve`` keeps a generated one). Exit 1 when any item FAILs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.locations import DataDir
from loraplex.cli.url_option import base_url
from loraplex.registry import default_data_dir

Opt = typer.Option
ADMIN_KEY_FILE = "admin-key"  # NOTE: the name serve/bootstrap.py writes (kept torch-free here)


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight_command)


def _key_file(data_dir: Path | None) -> Path:
    return (data_dir or default_data_dir(os.environ, Path.home())) / ADMIN_KEY_FILE


def _admin_key(admin_key: str | None, data_dir: Path | None) -> str:
    if admin_key:
        return admin_key
    path = _key_file(data_dir)
    if not path.is_file():
        raise typer.BadParameter(
            f"no --admin-key and no {path}; pass the deployment's admin key, or the --data-dir"
            " (LORAPLEX_DATA_DIR) its `loraplex serve` keeps it in",
            param_hint="--admin-key",
        )
    return path.read_text(encoding="utf-8").strip()


def key_file_hint(status: int | None, admin_key: str | None, data_dir: Path | None) -> str:
    """What to add to a refusal: on a 401 with the key read from the data directory's file, that
    the file may hold another key than the server's. NOTE: serve with --admin-key (or
    LORAPLEX_ADMIN_KEY) leaves that file as it was, so the 401 read as a wrong key for no reason."""
    if status != 401 or admin_key:
        return ""
    return (
        f"; the admin key was read from {_key_file(data_dir)}: a serve started with --admin-key "
        "(or LORAPLEX_ADMIN_KEY) runs with that key and leaves the file as it was; pass its key "
        "with --admin-key"
    )


def refuse_with_self(admin_key: str | None, data_dir: Path | None) -> None:
    """``--self`` starts a server of its own: a deployment's admin key or data directory (given
    as a flag or through its environment variable) would do nothing, so it is refused by name."""
    for given, flag, env in (
        (admin_key, "--admin-key", "LORAPLEX_ADMIN_KEY"),
        (data_dir, "--data-dir", "LORAPLEX_DATA_DIR"),
    ):
        if given:
            raise typer.BadParameter(
                f"--self starts its own server; no {flag} (nor {env})", param_hint=flag
            )


def preflight_command(
    url: Annotated[str, Opt(help="Base URL of the server or fleet ingress.", parser=base_url)],
    *,
    admin_key: Annotated[
        str | None, Opt(envvar="LORAPLEX_ADMIN_KEY", help="Admin credential (default: data dir).")
    ] = None,
    data_dir: DataDir = None,
    tenant_key: Annotated[
        str | None,
        Opt(
            help="Tenant key for the refusal probes, and for the load test when the admin API "
            "issues no key (default: throwaway keys, revoked after)."
        ),
    ] = None,
    load_seconds: Annotated[float, Opt(help="Wall time of the load test, 0 < s <= 600.")] = 6.0,
    concurrency: Annotated[int, Opt(help="Hot-traffic requests in flight (1-64).")] = 4,
    rules: Annotated[
        Path | None, Opt(help="Prometheus rules file the deployment loads (eviction alerts).")
    ] = None,
    json_output: Annotated[bool, Opt("--json", help="Print the report as one JSON line.")] = False,
    report: Annotated[Path | None, Opt(help="Also write the JSON report to this file.")] = None,
    timeout_s: Annotated[float, Opt(help="Seconds per HTTP request, finite, > 0.")] = 120.0,
) -> None:
    """Check the 14 launch items against a running deployment: PASS / WARN / FAIL each."""
    from loraplex.preflight import LoadConfig, PreflightConfig, PreflightError, preflight

    try:  # the field is ``load_s``: name the flag the user typed (it read "load_s 0.0")
        LoadConfig(load_s=load_seconds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--load-seconds") from None
    try:
        config = PreflightConfig(
            url=url, admin_key=_admin_key(admin_key, data_dir), tenant_key=tenant_key,
            rules_text=None if rules is None else rules.read_text(encoding="utf-8"),
            timeout_s=timeout_s, load=LoadConfig(load_s=load_seconds, concurrency=concurrency),
        )  # fmt: skip
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        result = preflight(config)
    except PreflightError as exc:
        typer.echo(f"preflight: {exc}{key_file_hint(exc.status, admin_key, data_dir)}", err=True)
        raise typer.Exit(2) from None
    typer.echo(result.json_line() if json_output else result.text())
    if report is not None:
        try:
            report.write_text(result.json_line() + "\n", encoding="utf-8")
        except OSError as exc:  # the report was printed; the file could not be written
            typer.echo(f"preflight: --report {report}: {exc}", err=True)
            raise typer.Exit(2) from None
    raise typer.Exit(result.exit_code())
