"""Where the registry and the artifacts live: the location options every command that opens the
registry takes (``loraplex serve`` and the registry commands), each with its environment
variable, so one exported ``LORAPLEX_DATABASE_URL`` means the same database to all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DataDir = Annotated[
    Path | None,
    typer.Option(
        envvar="LORAPLEX_DATA_DIR",
        help="Data directory (default: $XDG_DATA_HOME/loraplex or ~/.local/share/loraplex)",
    ),
]
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        envvar="LORAPLEX_DATABASE_URL",
        help="sqlite:///PATH or postgresql://... (default: SQLite in the data directory)",
    ),
]
Store = Annotated[
    str | None,
    typer.Option(
        envvar="LORAPLEX_STORE",
        help="Artifact store: a directory or s3://bucket/prefix (default: DATA_DIR/artifacts)",
    ),
]
S3Endpoint = Annotated[
    str | None, typer.Option(envvar="LORAPLEX_S3_ENDPOINT", help="S3-compatible endpoint URL")
]


def unusable_path(exc: OSError) -> str:
    """``exc`` as one line naming the path (``[Errno 17] File exists: 'x'`` reads as a bug)."""
    if exc.filename is None:
        return f"{exc.strerror or exc}"
    if isinstance(exc, FileExistsError):  # mkdir(exist_ok=True) on a file
        return f"cannot use {exc.filename}: it is not a directory"
    return f"cannot use {exc.filename}: {exc.strerror or exc}"
