"""Uploads stream into their staging files: a weights header over the cap is refused on its
8-byte length prefix, before the rest of the file is read; unknown, repeated or missing parts
are a 400 naming the part; nothing is left behind."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Rig
from starlette.requests import Request

from loraplex.artifacts.safetensors_header import MAX_HEADER_BYTES
from loraplex.errors import CorruptArtifactError
from loraplex.server.upload import receive_upload

BOUNDARY = "loraplex-test-boundary"


def _part(name: str, payload: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return (
        f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + payload + b"\r\n"
    )


def _fields(name: str) -> bytes:
    texts = {"tenant": "acme", "name": name, "revision": "s1"}
    return b"".join(_part(k, v.encode()) for k, v in texts.items())


def _post(rig: Rig, body: Iterator[bytes] | bytes) -> object:
    headers = {**rig.admin, "content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    return rig.client.post("/admin/adapters/upload", content=body, headers=headers)


def _uploads_left() -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob("loraplex-upload-*"))


def _huge_header_upload(config: bytes, sent: list[int]) -> Iterator[bytes]:
    yield _fields("huge-header") + _part("config", config, "adapter_config.json")
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="weights"; filename="w"\r\n\r\n'
    yield head.encode() + (100_000_000).to_bytes(8, "little")
    for _ in range(100):  # 100 MB of "header" follow, a MiB at a time
        sent.append(1)
        yield b" " * (1 << 20)
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def test_a_huge_header_is_refused_on_its_length_prefix(rig: Rig, tmp_path: Path) -> None:
    config = (rig.served.assets.adapters[0].path / "adapter_config.json").read_bytes()
    sent: list[int] = []
    chunks = _huge_header_upload(config, sent)

    async def receive() -> dict[str, object]:
        chunk = next(chunks, None)
        return {"type": "http.request", "body": chunk or b"", "more_body": chunk is not None}

    headers = [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]
    request = Request({"type": "http", "method": "POST", "headers": headers}, receive)
    with pytest.raises(CorruptArtifactError, match=str(MAX_HEADER_BYTES)):
        asyncio.run(receive_upload(request, tmp_path, 1 << 30))
    assert len(sent) <= 1  # refused on the prefix, before the rest of the file was read
    staged = tmp_path / "adapter_model.safetensors"
    assert staged.stat().st_size <= (1 << 20) + 8

    before = set(_uploads_left())  # over HTTP: a 422 naming the cap, nothing left behind
    reply = _post(rig, b"".join(_huge_header_upload(config, [])))
    assert reply.status_code == 422, reply.text  # type: ignore[attr-defined]
    error = reply.json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == "invalid_adapter" and str(MAX_HEADER_BYTES) in error["message"]
    assert set(_uploads_left()) == before


def test_unknown_repeated_and_missing_parts_are_a_400_naming_them(rig: Rig) -> None:
    config = _part("config", b"{}", "adapter_config.json")
    end = f"--{BOUNDARY}--\r\n".encode()
    unknown = _post(rig, _fields("x") + config + _part("path", b"/etc/passwd") + end)
    repeated = _post(rig, _fields("x") + config + config + end)
    missing = _post(rig, _fields("x") + config + end)
    for reply, param in ((unknown, None), (repeated, "config"), (missing, "weights")):
        assert reply.status_code == 400, reply.text  # type: ignore[attr-defined]
        if param is not None:
            assert reply.json()["error"]["param"] == param  # type: ignore[attr-defined]
    assert "path" in unknown.json()["error"]["message"]  # type: ignore[attr-defined]


def test_an_upload_that_is_not_multipart_is_a_400(rig: Rig) -> None:
    reply = rig.client.post("/admin/adapters/upload", json={"tenant": "acme"}, headers=rig.admin)
    assert reply.status_code == 400
