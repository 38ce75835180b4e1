"""``sim calibrate --url`` naming nothing to calibrate (nothing answering, a server that is not
loraplex's admin API, or one with no single-revision adapter) exits 2 with one line naming
``--url`` and what is wrong, as a refused admin call does; one that is not an http(s) URL is a
usage error naming ``--url``. NOTE: each
ended in a traceback (httpx's error, or ``remote_target``'s bare ``ValueError``)."""

from __future__ import annotations

import socket
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler

import pytest
from local_http import local_server
from test_sim_validate import _sim_group
from typer.testing import CliRunner


def _answering(body: bytes) -> AbstractContextManager[str]:
    """The URL of an HTTP server answering every GET with 200 and ``body``."""

    class _Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return local_server(_Handler)


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens once it is closed


def _calibrate(url: str) -> tuple[int, str]:
    args = ["calibrate", "--out", "o.json", "--hardware", "h", "--url", url, "--admin-key", "k"]
    result = CliRunner().invoke(_sim_group(), args)
    return result.exit_code, result.output


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://example.com", "http://", "http://[::1"])
def test_a_url_that_is_not_http_is_refused_at_parsing(url: str) -> None:
    """Since smallfix, typer's usage error naming ``--url`` (``cli/url_option.base_url``, as
    ``qualify`` and ``preflight``; tests/test_cli_url.py), before anything is measured."""
    code, output = _calibrate(url)
    out = " ".join(output.split())
    assert code == 2 and "Invalid value for '--url'" in out, out


def test_a_url_where_nothing_answers_is_one_line_and_exit_2() -> None:
    url = _closed_port_url()
    code, output = _calibrate(url)
    assert code == 2, output
    assert output.startswith(f"sim calibrate: --url {url}: nothing answered (ConnectError: ")
    assert output.count("\n") == 1


@pytest.mark.parametrize(
    ("body", "wrong"),
    [
        (b"<html>not an API</html>", "its answers are not loraplex's admin API (JSONDecodeError: "),
        (b"[]", "it serves no adapter whose alias names one revision"),
    ],
)
def test_a_server_with_nothing_to_calibrate_is_one_line_and_exit_2(body: bytes, wrong: str) -> None:
    with _answering(body) as url:
        code, output = _calibrate(url)
    assert code == 2, output
    assert output.startswith(f"sim calibrate: --url {url}: {wrong}")
    assert output.count("\n") == 1
