"""The registry commands' location options, declared once: ``located(command)`` gives a command
``--data-dir``, ``--database-url``, ``--store`` and ``--s3-endpoint`` (from ``cli/locations.py``,
with their environment variables) and hands them to it as one ``Location``.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.cli.locations import DatabaseUrl, DataDir, S3Endpoint, Store
from loraplex.registry import RegistryConfig, default_data_dir
from loraplex.registry.trust import DEFAULT_MAX_TRUST_ANCHORS


@dataclass(frozen=True)
class Location:
    """Where the registry is: the four location options every command here takes."""

    data_dir: Path | None  # --data-dir; None: the default data directory
    database_url: str | None  # --database-url; None: SQLite in the data directory
    store: str | None  # --store; None: DATA_DIR/artifacts
    s3_endpoint: str | None  # --s3-endpoint

    def config(
        self, max_lora_rank: int = 64, max_trust_anchors: int = DEFAULT_MAX_TRUST_ANCHORS
    ) -> RegistryConfig:
        return RegistryConfig(
            data_dir=self.data_dir or default_data_dir(os.environ, Path.home()),
            database_url=self.database_url,
            store=self.store,
            s3_endpoint=self.s3_endpoint,
            max_lora_rank=max_lora_rank,
            max_trust_anchors=max_trust_anchors,
        )


_LOCATION_OPTIONS = (
    ("data_dir", DataDir),
    ("database_url", DatabaseUrl),
    ("store", Store),
    ("s3_endpoint", S3Endpoint),
)


def located(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` as typer sees it: its ``location`` parameter replaced by the four location
    options (declared once, in ``cli/locations.py``), which it receives as one ``Location``."""
    signature = inspect.signature(command, eval_str=True)
    kept = [p for name, p in signature.parameters.items() if name != "location"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hint)
        for name, hint in _LOCATION_OPTIONS
    ]

    @functools.wraps(command)
    def with_location(**kwargs: Any) -> None:
        options = [kwargs.pop(name) for name, _ in _LOCATION_OPTIONS]
        command(location=Location(*options), **kwargs)

    params = [*kept, *added]
    with_location.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    with_location.__annotations__ = {p.name: p.annotation for p in params}
    return with_location
