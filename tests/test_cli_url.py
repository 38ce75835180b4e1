"""Every command taking a deployment's ``--url`` (``qualify``, ``preflight``, ``sim calibrate``)
refuses one that is not ``http(s)://HOST...`` at argument parsing, naming ``--url``, before any
work. NOTE: ``qualify --url ftp://x`` wrote its report directory and generated its hostile
adapters for 75 s before ``GET ftp://x/admin/tenants failed``; ``preflight --url http://`` (no
host) went on to a DNS lookup, and ``preflight --url ftp://x`` was refused as ``Invalid value:``
naming no flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import loraplex.cli as cli

KEY = "lpxadmin_" + "k" * 40
BAD = ["ftp://x", "http://", "localhost:8000", "http://[::1", "https://host:0", "https://h:99999"]
COMMANDS = {
    "qualify": ["qualify", "--admin-key", KEY],
    "preflight": ["preflight", "--admin-key", KEY],
    "sim calibrate": ["sim", "calibrate", "--admin-key", KEY, "--out", "o.json", "--hardware", "h"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("url", BAD)
def test_a_url_that_is_not_http_with_a_host_is_refused_at_parsing(
    command: str, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # qualify wrote qualify-reports/ here before it refused
    result = CliRunner().invoke(cli.app, [*COMMANDS[command], "--url", url])
    out = " ".join(result.output.split())
    assert result.exit_code == 2, out
    assert "Invalid value for '--url'" in out, out
    assert "expected http://HOST[:PORT] or https://HOST[:PORT]" in out, out
    assert list(tmp_path.iterdir()) == []  # nothing done


def test_a_good_url_passes_the_parser_unchanged() -> None:
    from loraplex.cli.url_option import base_url

    for url in ("http://127.0.0.1:8000", "https://ingress.example/prefix", "HTTP://[::1]:80"):
        assert base_url(url) == url
