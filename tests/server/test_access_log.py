"""``--access-log/--no-access-log`` (``access_log``): uvicorn's one line per HTTP request, on by
default, none when off, from the flag or the config file to the listener of ``serve`` and of a
fleet's ingress."""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path

import httpx
import pytest
from live import listening
from starlette.types import Receive, Scope, Send
from test_serve_config import parsed_serve

from loraplex.cli import serve_start
from loraplex.fleet import listener
from loraplex.server.listeners import ConnectionLimits


class Lines(logging.Handler):
    """The records of the logger it is attached to."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("access_log", [True, False])
def test_the_listener_logs_each_request_only_with_the_access_log(access_log: bool) -> None:
    lines = Lines()
    with listening(_ok, ConnectionLimits(), log_level="info", access_log=access_log) as (url, _):
        access = logging.getLogger("uvicorn.access")
        access.addHandler(lines)  # after uvicorn configured its loggers
        try:
            assert httpx.get(f"{url}/v1/models?after=x").status_code == 204
        finally:
            access.removeHandler(lines)
    if access_log:
        (line,) = lines.lines
        assert '"GET /v1/models?after=x HTTP/1.1" 204' in line
    else:
        assert lines.lines == []


def test_the_flag_and_the_config_key_reach_the_settings(tmp_path: Path) -> None:
    data = ("--data-dir", str(tmp_path))  # NOTE: a tuple: click consumes a list it is given
    assert parsed_serve([*data], {}).access_log is True
    assert parsed_serve([*data, "--no-access-log"], {}).access_log is False
    path = tmp_path / "serve.toml"
    path.write_text("[serve]\naccess_log = false\n")
    config = ("--config", str(path), *data)
    assert parsed_serve([*config], {}).access_log is False
    assert parsed_serve([*config, "--access-log"], {}).access_log is True  # the flag wins
    path.write_text('[serve]\naccess_log = "no"\n')
    with pytest.raises(ValueError, match="access_log = 'no' is invalid; expected a boolean"):
        parsed_serve([*config], {})


def _listener_keywords(module: object, function: str) -> set[str]:
    """The keyword arguments every ``function`` in ``module`` passes to ``ListenerConfig``."""
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())  # type: ignore[arg-type]
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    calls = [
        c
        for f in found
        for c in ast.walk(f)
        if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "ListenerConfig"
    ]
    assert calls, f"no {function} calls ListenerConfig"
    return {k.arg for c in calls for k in c.keywords if k.arg is not None}


def test_serve_and_the_fleet_ingress_hand_it_to_their_listener() -> None:
    assert "access_log" in _listener_keywords(serve_start, "listen")
    assert "access_log" in _listener_keywords(listener, "__init__")
