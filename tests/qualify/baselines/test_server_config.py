"""A comparator server's config file names its data directory and model as the qualify process
sees them. serve reads a file's relative paths relative to the file (which lies in the data
directory), so qualify's default, relative ``--report-dir`` put both under themselves twice:
every separate comparator failed on a missing model and every in-context one got a 401 (its key
was issued in another registry), in a run whose cells all passed. Nor do they read the
operator's ``LORAPLEX_*`` variables, which win over their own config."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loraplex.bench.harness.process import Launch
from loraplex.demo.assets import DemoAssets
from loraplex.qualify import selfserve
from loraplex.qualify.baselines import server
from loraplex.qualify.baselines.server import ServerSpec, _config_text
from loraplex.serve.config import read_config_file


def test_relative_places_mean_what_they_mean_to_qualify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = ServerSpec(Path("reports/run/merged/m"), Path("reports/run/servers/s"), 512)
    spec.data_dir.mkdir(parents=True)
    config = spec.data_dir / "serve.toml"
    config.write_text(_config_text(spec, 8123), encoding="utf-8")
    read = read_config_file(config)
    assert Path(read["data_dir"]) == tmp_path / "reports/run/servers/s"
    assert Path(read["model"]) == tmp_path / "reports/run/merged/m"


class _Captured(Exception):
    """Raised by the fake launcher once it has the launch in hand."""


def _capture(launches: list[Launch]):  # type: ignore[no-untyped-def]
    @contextmanager
    def fake(launch: Launch) -> Iterator[None]:
        launches.append(launch)
        raise _Captured
        yield  # a generator, as serving_process is

    return fake


def test_servers_of_qualifys_own_never_read_the_operators_loraplex_variables(
    demo_assets: DemoAssets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve's variables win over its config file and flags' absence: with the operator's
    ``LORAPLEX_DATA_DIR`` exported (as the docs show), a comparator server served the
    operator's registry rather than its own, and its key, issued in its own, was a 401."""
    monkeypatch.setenv("LORAPLEX_DATA_DIR", str(tmp_path / "operators"))
    monkeypatch.setenv("LORAPLEX_DATABASE_URL", "postgresql://prod@db:5432/loraplex")
    launches: list[Launch] = []
    monkeypatch.setattr(server, "serving_process", _capture(launches))
    monkeypatch.setattr(selfserve, "serving_process", _capture(launches))
    spec = ServerSpec(demo_assets.base_model_dir, tmp_path / "comparator", 512)
    with pytest.raises(_Captured), server.comparator_server(spec):
        pass
    with pytest.raises(_Captured), selfserve.self_server(demo_assets.root, tmp_path / "run"):
        pass
    assert len(launches) == 2
    for launch in launches:
        assert not [k for k in launch.env if k.startswith("LORAPLEX_")], launch.name
        assert launch.env["PATH"] == os.environ["PATH"]  # the rest is kept
