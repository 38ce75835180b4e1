"""A refused adapter's 422 names the file as the caller knows it (``upload/...`` or the path
given under the import directory), never the server's staging directory (it showed
``/tmp/loraplex-upload-xxxx/adapter_model.safetensors``)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from conftest import Rig, Served, make_app_deps
from fakes import FakeEngine
from fastapi.testclient import TestClient
from httpx import Response

from loraplex.server.app import create_app


def _broken_adapter(served: Served, where: Path) -> Path:
    where.mkdir(parents=True)
    source = served.assets.adapter("acme", "support", "r1").path
    shutil.copy(source / "adapter_config.json", where / "adapter_config.json")
    # a length prefix that claims more header than the file holds
    (where / "adapter_model.safetensors").write_bytes((100).to_bytes(8, "little") + b"{}")
    return where


def _import(served: Served, import_dir: Path, path: str) -> Response:
    """``POST /admin/adapters`` of ``path`` on an app whose ``import_dir`` is ``import_dir``."""
    deps = make_app_deps(served, FakeEngine())
    deps = replace(deps, config=replace(deps.config, import_dir=import_dir))
    body = {"path": path, "tenant": "acme", "name": path.rsplit("/", 1)[-1], "revision": "b1"}
    with TestClient(create_app(deps)) as client:
        auth = {"Authorization": f"Bearer {deps.config.admin_key}"}
        reply = client.post("/admin/adapters", json=body, headers=auth)
    assert deps.cache is not None
    deps.cache.close()
    return reply


def _check_hidden(message: str, shown: str) -> None:
    assert message.startswith(f"{shown}/adapter_model.safetensors: "), message
    assert tempfile.gettempdir() not in message and "loraplex-" not in message, message


def test_an_upload_error_names_the_uploaded_file_not_the_staging_path(
    rig: Rig, tmp_path: Path
) -> None:
    broken = _broken_adapter(rig.served, tmp_path / "broken")
    files = {
        "config": ("adapter_config.json", (broken / "adapter_config.json").read_bytes()),
        "weights": ("w", (broken / "adapter_model.safetensors").read_bytes()),
    }
    form = {"tenant": "acme", "name": "broken", "revision": "b1"}
    reply = rig.client.post("/admin/adapters/upload", files=files, data=form, headers=rig.admin)
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"]["code"] == "invalid_adapter"
    _check_hidden(reply.json()["error"]["message"], "upload")


def test_an_import_error_names_the_given_path_not_the_private_copy(
    served: Served, tmp_path: Path
) -> None:
    _broken_adapter(served, tmp_path / "imports" / "acme" / "broken")
    reply = _import(served, tmp_path / "imports", "acme/broken")
    assert reply.status_code == 422, reply.text
    _check_hidden(reply.json()["error"]["message"], "acme/broken")


def test_an_alpha_past_float32_is_refused_at_upload_and_registers_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    # lora_alpha 1e39 registered (a finite number > 0), then every request of the revision
    # failed in the LoRA op; 10**400 was a 500 (OverflowError computing its scale)
    source = rig.served.assets.adapter("acme", "support", "r1").path
    config = json.loads((source / "adapter_config.json").read_text())
    weights = (source / "adapter_model.safetensors").read_bytes()
    for revision, alpha in (("a1", "1e39"), ("a2", "1" + "0" * 400)):
        text = json.dumps({**config, "lora_alpha": 0}).replace(
            '"lora_alpha": 0', f'"lora_alpha": {alpha}'
        )
        files = {"config": ("adapter_config.json", text.encode()), "weights": ("w", weights)}
        form = {"tenant": "acme", "name": "loud", "revision": revision}
        reply = rig.client.post("/admin/adapters/upload", files=files, data=form, headers=rig.admin)
        assert reply.status_code == 422, reply.text
        error = reply.json()["error"]
        assert error["code"] == "invalid_adapter"
        assert "'lora_alpha'" in error["message"] and "float32" in error["message"]
    assert rig.client.get("/admin/adapters/acme/loud", headers=rig.admin).status_code == 404


def test_an_import_dir_removed_while_serving_is_a_400_naming_it(
    served: Served, tmp_path: Path
) -> None:
    # it was a 500 internal_error: os.open of the missing root raised FileNotFoundError
    reply = _import(served, tmp_path / "gone", "acme/x")
    assert reply.status_code == 400, reply.text
    assert "import_dir" in reply.json()["error"]["message"]
