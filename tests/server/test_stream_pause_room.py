"""``stream_pause_bytes`` must leave room below ``max_stream_buffer_bytes`` for what a stream
receives after its pause (``stream_buffer.MIN_PAUSE_ROOM_BYTES``): the pause is taken between
engine steps, so what was generated meanwhile still arrives and counts against the buffer.
A pause within that much of the buffer was taken, and a client that merely fell behind could
be cut with ``stream_not_read``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loraplex.cli import app
from loraplex.cli import serve as serve_cli
from loraplex.serve.config import ServeConfig
from loraplex.server.stream_buffer import MIN_PAUSE_ROOM_BYTES

BUFFER = 256 << 10  # the default max_stream_buffer_bytes


@pytest.mark.parametrize(
    ("values", "room"),
    [
        ({"stream_pause_bytes": BUFFER - 1}, 1),
        ({"stream_pause_bytes": BUFFER - MIN_PAUSE_ROOM_BYTES + 1}, MIN_PAUSE_ROOM_BYTES - 1),
        ({"max_stream_buffer_bytes": 96 << 10}, 32 << 10),  # the default pause, 64 KiB
    ],
)
def test_a_pause_too_close_to_the_buffer_is_refused_naming_both_keys(
    tmp_path: Path, values: dict[str, int], room: int
) -> None:
    with pytest.raises(ValueError, match=r"stream_pause_bytes \d+ leaves (\d+) bytes") as info:
        ServeConfig(data_dir=tmp_path, **values)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"leaves {room} bytes below max_stream_buffer_bytes" in message
    assert f"expected at least {MIN_PAUSE_ROOM_BYTES}" in message


@pytest.mark.parametrize(
    "values",
    [
        {},  # the defaults: 192 KiB of room
        {"stream_pause_bytes": BUFFER - MIN_PAUSE_ROOM_BYTES},  # exactly the room
        {"stream_pause_bytes": BUFFER},  # never paused: the overflow abort alone bounds
        {"stream_pause_bytes": 1 << 30, "max_stream_buffer_bytes": 16 << 10},
    ],
)
def test_settings_that_leave_the_room_or_never_pause_pass(
    tmp_path: Path, values: dict[str, int]
) -> None:
    config = ServeConfig(data_dir=tmp_path, **values)  # type: ignore[arg-type]
    assert config.stream_pause_bytes == values.get("stream_pause_bytes", 64 << 10)


def test_the_command_line_refuses_it_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[ServeConfig] = []
    monkeypatch.setattr(serve_cli, "_run", started.append)  # never serves
    flags = ["--max-stream-buffer-bytes", str(100 << 10), "--stream-pause-bytes", str(80 << 10)]
    result = CliRunner().invoke(app, ["serve", "--data-dir", str(tmp_path), *flags])
    assert result.exit_code != 0 and not started
    shown = " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split())  # rich's box, unwrapped
    assert "stream_pause_bytes 81920 leaves 20480 bytes below max_stream_buffer_bytes" in shown
