"""What an operator new to ``loraplex qualify --url`` met against their own ``loraplex serve``:
the default ``--assets`` was the checkout's test set (relative to the working directory, absent
elsewhere), a refused registration ended the run on a bare 422, and comparators that failed in
every cell were left out of the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from loraplex.cli.qualify import DEFAULT_ASSETS, _default_assets, _summary
from loraplex.cli.qualify import register as register_qualify
from loraplex.qualify.client import Admin, QualifyError, Reply
from loraplex.qualify.population import GeneratedAdapter, register, register_all
from loraplex.qualify.run import _model_dir


def test_url_reads_the_demo_set_serve_serves_from_the_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _default_assets(False, tmp_path) == tmp_path / "demo-assets"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert _default_assets(False, None) == tmp_path / "xdg" / "loraplex" / "demo-assets"
    assert _default_assets(True, tmp_path) == DEFAULT_ASSETS


def test_assets_without_a_model_name_the_flag_and_what_it_expects(tmp_path: Path) -> None:
    with pytest.raises(QualifyError) as refused:
        _model_dir(tmp_path)
    message = str(refused.value)
    assert message.startswith(f"--assets {tmp_path}: its models/ must hold one base model")
    assert "<data dir>/demo-assets" in message


class _RefusingAdmin:
    def upload(self, adapter_dir: Path, fields: dict[str, str]) -> Reply:
        return Reply(422, {"error": {"message": "field 'r' is 128; expected <= 64"}})


def test_a_refused_registration_says_what_the_deployment_must_accept(tmp_path: Path) -> None:
    adapter = GeneratedAdapter("qualify-a", "heavy-tail-0000", 128, ("q_proj",), tmp_path)
    with pytest.raises(QualifyError) as refused:
        register(_RefusingAdmin(), adapter)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "registering qualify-a/heavy-tail-0000@q2 (rank 128): 422" in message
    assert "max_lora_rank at least the plan's largest rank" in message
    assert "matrix.rank_distributions" in message


class _RankCappedAdmin:
    """A deployment with ``max_lora_rank`` 64: uploads of rank 128 refused, the rest kept."""

    def __init__(self) -> None:
        self.uploaded: list[str] = []

    def upload(self, adapter_dir: Path, fields: dict[str, str]) -> Reply:
        if adapter_dir.name.startswith("heavy"):
            return Reply(422, {"error": {"message": "field 'r' is 128; expected <= 64"}})
        self.uploaded.append(adapter_dir.name)
        return Reply(201, {})

    def must(self, method: str, path: str, **kw: object) -> dict[str, object]:
        return {}


def test_the_largest_rank_registers_first_so_a_refusal_registers_nothing(tmp_path: Path) -> None:
    """newop4: against a deployment whose ``max_lora_rank`` was below the plan's largest rank,
    ``qualify --url`` registered every smaller adapter (32 on the default plan) before the
    refusal ended the run (and then retired them all)."""

    def made(name: str, rank: int) -> GeneratedAdapter:
        return GeneratedAdapter("qualify-a", name, rank, ("q_proj",), tmp_path / name)

    plan = [made("uniform-0000", 8), made("uniform-0001", 8), made("heavy-tail-0000", 128)]
    admin, registered = _RankCappedAdmin(), []
    with pytest.raises(QualifyError, match="rank 128"):
        register_all(admin, plan, registered)  # type: ignore[arg-type]
    assert admin.uploaded == [] and registered == []
    admin = _RankCappedAdmin()
    fits = [made("uniform-0000", 8), made("skewed-0000", 16), made("uniform-0001", 8)]
    register_all(admin, fits, registered)  # type: ignore[arg-type]
    assert admin.uploaded == ["skewed-0000", "uniform-0000", "uniform-0001"]  # stable within
    assert [a.name for a in registered] == admin.uploaded


def _cell(methods: dict[str, Any]) -> dict[str, Any]:
    return {"cell_id": "c", "passed": True, "reasons": [], "methods": methods}


def test_the_summary_names_a_comparator_that_failed() -> None:
    failed = {"status": "failed", "reason": "RuntimeError: serve exited with 1:\nno model at X\n"}
    payload = {
        "num_cells": 2,
        "failed_cells": [],
        "headline": {},
        "cells": [
            _cell({"loraplex": {"method": "loraplex"}, "separate": failed}),
            _cell({"loraplex": {"method": "loraplex"}, "separate": {"method": "separate"}}),
        ],
    }
    text = _summary(payload, Path("r"))
    assert (
        "comparator separate failed in 1 of 2 cells (its ratios are null there): "
        "RuntimeError: serve exited with 1: no model at X"
    ) in text
    assert "comparator loraplex" not in text


def _qualify_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """loraplex"""

    register_qualify(app)
    return app


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--admin-key", "k"], {}, "no --admin-key (nor LORAPLEX_ADMIN_KEY)"),
        ([], {"LORAPLEX_ADMIN_KEY": "k"}, "no --admin-key (nor LORAPLEX_ADMIN_KEY)"),
        (["--data-dir", "d"], {}, "no --data-dir (nor LORAPLEX_DATA_DIR)"),
        ([], {"LORAPLEX_DATA_DIR": "d"}, "no --data-dir (nor LORAPLEX_DATA_DIR)"),
    ],
)
def test_self_refuses_a_deployments_key_and_data_dir_by_name(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    """NOTE: ``qualify --self`` ran its own server and silently ignored both."""
    base = {"LORAPLEX_ADMIN_KEY": "", "LORAPLEX_DATA_DIR": ""}
    argv = ["qualify", "--self", "--report-dir", str(tmp_path), *args]
    result = CliRunner().invoke(_qualify_app(), argv, env={**base, **env})
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())
    assert not any(tmp_path.iterdir())  # refused before a run directory was made


def test_a_401_with_the_key_file_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE: ``serve --admin-key`` leaves ``<data dir>/admin-key`` as it was; a 401 with the
    file's (older) key read as a wrong key with no cause named."""
    admin = Admin("http://deployment", "lpxadmin_old", 5.0)
    refuse = httpx.MockTransport(lambda request: httpx.Response(401, json={"error": "no"}))
    admin._http = httpx.Client(base_url=admin.url, transport=refuse)
    with pytest.raises(QualifyError) as refused:
        admin.must("GET", "/admin/tenants")
    assert refused.value.status == 401

    def _refused(*args: object, **kwargs: object) -> None:
        raise refused.value

    monkeypatch.setattr("loraplex.cli.qualify._run", _refused)
    (tmp_path / "admin-key").write_text("lpxadmin_" + "o" * 40 + "\n", encoding="utf-8")
    argv = ["qualify", "--url", "http://deployment", "--data-dir", str(tmp_path)]
    argv += ["--report-dir", str(tmp_path / "reports")]
    result = CliRunner().invoke(_qualify_app(), argv, env={"LORAPLEX_ADMIN_KEY": ""})
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert "GET /admin/tenants -> 401" in out
    assert f"the admin key was read from {tmp_path / 'admin-key'}" in out
    given = CliRunner().invoke(_qualify_app(), [*argv, "--admin-key", "lpxadmin_" + "g" * 40])
    assert given.exit_code == 2 and "read from" not in given.output


def _manifest_only(root: Path, preset: str) -> Path:
    """A demo set's manifest alone (the preset check reads nothing else)."""
    import json

    root.mkdir(parents=True)
    body = {"base_model": {"path": "models/m"}, "adapters": [], "preset": preset, "seed": 0}
    (root / "manifest.json").write_text(json.dumps(body), encoding="utf-8")
    return root


@pytest.mark.parametrize("mode", ["--self", "--url"])
def test_a_preset_other_than_the_served_sets_is_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """newop: ``--preset`` only reached the comparators, which refuse a set of another preset:
    ``qualify --self --preset large`` (``--self`` serves the small set) ran every cell, then
    failed every comparator in every cell, each ratio null."""

    def _ran(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run was started")

    monkeypatch.setattr("loraplex.cli.qualify._run", _ran)
    small = _manifest_only(tmp_path / "small-set", "small")
    argv = ["qualify", "--preset", "large", "--assets", str(small)]
    argv += ["--report-dir", str(tmp_path / "reports")]
    if mode == "--url":
        argv += ["--url", "http://deployment", "--admin-key", "lpxadmin_" + "k" * 40]
    else:
        argv += ["--self"]
    result = CliRunner().invoke(_qualify_app(), argv, env={"LORAPLEX_ADMIN_KEY": ""})
    out = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "Invalid value for --preset" in out, out
    assert "'large' is not the preset" in out and "'small'" in out
    assert not (tmp_path / "reports").exists()  # refused before a run directory was made


def test_the_served_sets_own_preset_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []

    def _ran(*args: object, **kwargs: object) -> None:
        started.append(str(kwargs["preset"]))
        raise QualifyError("stopped here")

    monkeypatch.setattr("loraplex.cli.qualify._run", _ran)
    large = _manifest_only(tmp_path / "large-set", "large")
    argv = ["qualify", "--url", "http://deployment", "--preset", "large", "--assets", str(large)]
    argv += ["--report-dir", str(tmp_path / "reports"), "--admin-key", "lpxadmin_" + "k" * 40]
    result = CliRunner().invoke(_qualify_app(), argv, env={"LORAPLEX_ADMIN_KEY": ""})
    assert result.exit_code == 2 and "stopped here" in result.output
    assert started == ["large"]


def test_the_summary_gives_each_cells_cost_per_correct_request() -> None:
    """The summary printed the headline's ratios only (null in every --quick run, and as a
    Python dict: None), never what a correct answer cost; it is now one line per cell (newop4)."""
    payload = {
        "num_cells": 1,
        "failed_cells": [],
        "headline": {"cost_per_correct_request_over_in_context": None},
        "cells": [
            {
                **_cell(
                    {
                        "loraplex": {"method": "loraplex", "cost_per_correct_request": 1.3e-06},
                        "separate": {"method": "separate", "cost_per_correct_request": None},
                        "in_context": {"status": "failed", "reason": "x"},
                    }
                ),
                "correct_requests": 8,
                "requests": 8,
            }
        ],
    }
    text = _summary(payload, Path("r"))
    assert (
        "cell c: 8 of 8 requests correct; USD per correct request: loraplex 1.3e-06, "
        "separate null, in_context null"
    ) in text
    assert 'headline: {"cost_per_correct_request_over_in_context": null}' in text
