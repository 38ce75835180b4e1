"""``loraplex k8s render`` through the CLI: stdout or a directory, errors naming the flag, and no
credential from the environment it runs in."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]
from typer.testing import CliRunner

from loraplex.cli import app

REQUIRED = ["k8s", "render", "--image", "ghcr.io/acme/loraplex:1.0", "--store", "s3://b/p"]


def run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, [*REQUIRED, *args])
    assert result.exit_code == code, result.output
    return result.output


def test_stdout_is_one_stream_of_every_document() -> None:
    text = run("--name", "lpx", "--replicas", "3", "--max-loras", "12", "--no-gpu")
    found = [d for d in yaml.safe_load_all(text) if d]
    kinds = [d["kind"] for d in found]
    assert kinds.count("Deployment") == 2 and "InferencePool" in kinds and "RayService" not in kinds
    [replica] = [d for d in found if d["kind"] == "Deployment" and d["metadata"]["name"] == "lpx"]
    assert replica["spec"]["replicas"] == 3
    [ctr] = replica["spec"]["template"]["spec"]["containers"]
    args = ctr["args"]
    assert args[args.index("--max-loras") + 1] == "12"
    assert args[args.index("--device") + 1] == "cpu"
    assert "nvidia.com/gpu" not in ctr["resources"]["limits"]
    assert text.startswith("# Rendered by `loraplex k8s render`")


def test_ray_flag_renders_a_rayservice_whose_args_the_fleet_builder_accepts() -> None:
    from loraplex.fleet.settings import FLEET_KEYS
    from loraplex.serve.config import ServeConfig

    text = run("--ray", code=0)
    [service] = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "RayService"]
    [application] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert application["import_path"] == "loraplex.fleet.app:build"
    serve_keys = {f for f in ServeConfig.__dataclass_fields__}
    assert set(application["args"]) <= serve_keys | {"fleet"}
    assert set(application["args"]["fleet"]) <= set(FLEET_KEYS)


def test_out_writes_one_file_per_part(tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    run("--out", str(out))
    files = sorted(p.name for p in out.iterdir())
    assert files == ["10-replicas.yaml", "20-inference-pool.yaml"]
    pool = [d for d in yaml.safe_load_all((out / files[1]).read_text()) if d]
    assert pool[0]["kind"] == "InferencePool"
    replicas = [d["kind"] for d in yaml.safe_load_all((out / files[0]).read_text()) if d]
    assert replicas == ["Deployment", "Service"]


def test_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep", encoding="utf-8")
    output = run("--out", str(target), code=2)
    assert "--out" in output
    assert target.read_text(encoding="utf-8") == "keep"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--admin-port", "8000"], "--admin-port"),
        (["--database-url", "sqlite:///x.db"], "--database-url"),
        (["--s3-endpoint", "minio:9000"], "--s3-endpoint"),
        (["--memory", "lots"], "--memory"),
        (["--name", "LPX"], "--name"),
    ],
)
def test_a_bad_flag_is_named_and_nothing_is_written(
    args: list[str], flag: str, tmp_path: Path
) -> None:
    output = run(*args, "--out", str(tmp_path / "m"), code=2)
    assert flag in output
    assert not (tmp_path / "m").exists()


def test_a_bad_store_is_named() -> None:
    result = CliRunner().invoke(app, ["k8s", "render", "--image", "i", "--store", "/srv/a"])
    assert result.exit_code == 2 and "--store" in result.output


def test_serve_config_file_goes_to_a_config_map_and_bad_keys_are_named(tmp_path: Path) -> None:
    good = tmp_path / "serve.toml"
    good.write_text("[serve]\nmax_num_seqs = 16\nblock_size = 32\n", encoding="utf-8")
    found = [d for d in yaml.safe_load_all(run("--serve-config", str(good))) if d]
    [config_map] = [d for d in found if d["kind"] == "ConfigMap" and "serve.toml" in d["data"]]
    assert config_map["data"]["serve.toml"] == "[serve]\nblock_size = 32\nmax_num_seqs = 16\n"
    for text in ("[serve]\nport = 1\n", "[serve]\nbogus = 1\n", "[serve]\nmax_num_seqs = 0\n"):
        good.write_text(text, encoding="utf-8")
        assert "--serve-config" in run("--serve-config", str(good), code=2)


def test_no_credential_from_the_environment_reaches_the_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secrets = {
        "LORAPLEX_DATABASE_URL": "postgresql://u:db-sekrit@h/db",
        "LORAPLEX_ADMIN_KEY": "admin-sekrit-0123456789",
        "AWS_SECRET_ACCESS_KEY": "aws-sekrit",
        "AWS_ACCESS_KEY_ID": "AKIASEKRIT",
        "PGPASSWORD": "pg-sekrit",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    for extra in ([], ["--database-url", "postgresql://u@h/db"]):
        text = run(*extra)
        assert "sekrit" not in text.lower()
        assert "secretKeyRef" in text


def test_the_rendered_serve_file_uses_the_file_keys(tmp_path: Path) -> None:
    """``threads`` (the flag's name) in, ``threads`` out: the pod's file is read like the
    operator's (the field name ``torch_threads`` would be a deprecated key there)."""
    given = tmp_path / "serve.toml"
    given.write_text("[serve]\nthreads = 2\n", encoding="utf-8")
    found = [d for d in yaml.safe_load_all(run("--serve-config", str(given))) if d]
    [config_map] = [d for d in found if d["kind"] == "ConfigMap" and "serve.toml" in d["data"]]
    assert config_map["data"]["serve.toml"] == "[serve]\nthreads = 2\n"


def test_head_flags_size_the_ray_head_and_are_refused_without_ray() -> None:
    text = run("--ray", "--head-cpu", "2", "--head-memory", "6Gi")
    [service] = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "RayService"]
    [head] = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert head["resources"]["requests"] == {"cpu": "2", "memory": "6Gi"}
    for flag, value in (("--head-cpu", "2"), ("--head-memory", "6Gi")):
        output = run(flag, value, code=2)
        assert flag in output and "only with ray" in output


def test_the_config_files_fleet_table_reaches_the_rayservice(tmp_path: Path) -> None:
    """The file ``fleet up --config`` reads: its ``[fleet]`` table was dropped without a word."""
    config = tmp_path / "lpx.toml"
    config.write_text(
        '[serve]\npolicy = "lru"\n[fleet]\npolicy = "ray_multiplex"\nseed = 7\n'
        "[fleet.router]\nmax_queued = 4\n",
        encoding="utf-8",
    )
    text = run("--ray", "--serve-config", str(config))
    [service] = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "RayService"]
    [application] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    fleet = application["args"]["fleet"]
    assert (fleet["policy"], fleet["seed"], fleet["router"]) == (
        "ray_multiplex", 7, {"max_queued": 4}
    )  # fmt: skip
    assert application["args"]["policy"] == "lru"
    # without --ray no fleet reads it; a key the manifests set, or an unknown one: named
    assert "[fleet] keys ['policy', 'router', 'seed']" in run("--serve-config", str(config), code=2)
    for table, named in (("replicas = 3", "'replicas'"), ("replica = 3", "'replica'")):
        config.write_text(f"[fleet]\n{table}\n", encoding="utf-8")
        output = run("--ray", "--serve-config", str(config), code=2)
        assert named in output and "--serve-config" in output
