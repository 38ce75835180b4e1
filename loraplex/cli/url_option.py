"""``base_url``: the ``parser`` of a ``--url`` option (a deployment's base URL).

NOTE: ``qualify --url ftp://x`` was refused only after the run had started (its report
directory made, its plan loaded), and ``preflight --url http://`` (no host) passed the
``http://`` prefix check; now any URL other than ``http(s)://HOST[:PORT]...`` is typer's usage
error (exit 2) naming ``--url``, before any work.
"""

from __future__ import annotations

import typer

from loraplex.urls import http_url

EXPECTED = "expected http://HOST[:PORT] or https://HOST[:PORT]"


def base_url(value: str) -> str:
    """``value`` unchanged when it is an http or https URL with a host (and a valid port)."""
    if not http_url(value):
        raise typer.BadParameter(f"{value!r} is invalid; {EXPECTED}")
    return value
