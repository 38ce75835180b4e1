"""The request tracer ``loraplex serve`` (and a fleet's ingress) builds from its settings:
none unless ``trace_endpoint`` is set; the HMAC key for exported names is generated once and
kept in the data directory (0600), so one name hashes the same across restarts."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.serve.bootstrap import _write_secret
from loraplex.serve.config import ServeConfig
from loraplex.tracing.config import TracingConfig

if TYPE_CHECKING:
    from loraplex.tracing.exporter import Tracer

TRACE_SECRET_FILE = "trace-secret"


def trace_secret(data_dir: Path) -> bytes:
    """This data directory's HMAC key for traced names, generated on first use."""
    path = data_dir / TRACE_SECRET_FILE
    try:
        saved = path.read_text(encoding="utf-8").strip()
    except OSError:
        saved = ""
    if not saved:
        saved = secrets.token_hex(32)
        _write_secret(path, saved + "\n")
    return bytes.fromhex(saved)


def _tracer_class(endpoint: str) -> type[Tracer]:
    """The exporter's ``Tracer``; ValueError naming ``trace_endpoint`` without the extra."""
    try:
        from loraplex.tracing.exporter import Tracer
    except ImportError as exc:  # the optional extra is missing
        raise ValueError(
            f"trace_endpoint {endpoint!r} needs OpenTelemetry, which is not installed; expected "
            "pip install 'loraplex[otel]'"
        ) from exc
    return Tracer


def check_tracing_installed(config: ServeConfig) -> None:
    """What ``build_tracer`` refuses, checked before a start issues any key: a
    ``trace_endpoint`` without the ``otel`` extra was refused only once the HTTP side was
    built, after a first start had issued the demo tenants' keys (never shown)."""
    if config.trace_endpoint is not None:
        _tracer_class(config.trace_endpoint)


def build_tracer(config: ServeConfig, base_model: str) -> Tracer | None:
    """The tracer for ``config``; None when tracing is off."""
    if config.trace_endpoint is None:
        return None
    tracer = _tracer_class(config.trace_endpoint)
    settings = TracingConfig(
        endpoint=config.trace_endpoint,
        secret=trace_secret(config.data_dir),
        sample_ratio=config.trace_sample_ratio,
        slow_s=config.trace_slow_s,
        export_names=config.trace_export_names,
    )
    return tracer(settings, base_model)
