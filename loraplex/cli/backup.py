"""``loraplex backup DEST``: a consistent copy of a SQLite data directory while its server runs
(``registry/backup.py``), with the registry commands' location options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from loraplex.cli.registry_access import failures
from loraplex.cli.registry_location import Location, located
from loraplex.registry.backup import backup_data_dir


def register(app: typer.Typer) -> None:
    app.command("backup")(located(backup))


def backup(
    location: Location,
    dest: Annotated[Path, typer.Argument(help="A new (or empty) directory for the copy.")],
) -> None:
    """Copy the registry (SQLite online backup), the artifact store, the admin key and the demo
    assets into DEST, while the server runs; DEST is a data directory `serve` can start on."""
    with failures():
        done = backup_data_dir(location.config(), dest)
    typer.echo(f"registry   {done.database} (schema version {done.schema_version})")
    if done.remote_store is None:
        typer.echo(f"artifacts  {done.objects} objects, {done.object_bytes} bytes")
    else:
        typer.echo(
            f"artifacts  not copied: the store is {done.remote_store}; back up the bucket "
            "itself (versioning or replication)"
        )
    typer.echo(f"files      {', '.join(done.files) or 'none'}")
    typer.echo(f"restore    loraplex serve --data-dir {dest}")
