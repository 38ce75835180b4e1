"""``FleetSettings`` validation, ``check_fleet_config``, and ``loraplex fleet up``'s parsing (the
``[fleet]`` table, flags, thread shares) with Ray and the preparation replaced: nothing starts."""

from __future__ import annotations

import os
import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.cli import app
from loraplex.cli.fleet import default_threads_per_replica, fleet_file_values
from loraplex.demo.manifest import DemoAssets
from loraplex.fleet import control
from loraplex.fleet.settings import (
    FLEET_KEYS,
    MAX_REPORT_PERIOD_S,
    NOT_IN_FLEET,
    FleetSettings,
    check_fleet_config,
)
from loraplex.serve import config as serve_config
from loraplex.serve.bootstrap import ADMIN_KEY_FILE
from loraplex.serve.config import ServeConfig


def _settings(tmp_path: Path, **kw: Any) -> FleetSettings:
    return FleetSettings(serve=ServeConfig(data_dir=tmp_path), model_dir=tmp_path, **kw)


# --- FleetSettings ----------------------------------------------------------------------------


def test_defaults_are_valid(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert (settings.engine_replicas, settings.ingress_replicas) == (2, 1)
    assert settings.report_period_s <= MAX_REPORT_PERIOD_S
    assert settings.stale_after_s is None and settings.stale_bound_s == 3.0  # 6 × 0.5 s


def test_the_stale_bound_follows_the_report_period_unless_set(tmp_path: Path) -> None:
    assert _settings(tmp_path, report_period_s=1.0).stale_bound_s == 6.0
    assert _settings(tmp_path, report_period_s=0.25).stale_bound_s == 1.5
    assert _settings(tmp_path, stale_after_s=10).stale_bound_s == 10.0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # named as users set it, --replicas or the key replicas: engine_replicas is neither
        ({"engine_replicas": 0}, "^replicas 0 is invalid; expected an int >= 1"),
        ({"engine_replicas": True}, "^replicas True is invalid"),
        ({"engine_replicas": "2"}, "^replicas '2' is invalid"),
        ({"ingress_replicas": 2}, "ingress_replicas 2 is invalid; expected 1"),
        ({"policy": "round_robin"}, "policy 'round_robin' is invalid; expected one of"),
        ({"router": {"max_queued": 0}}, "max_queued"),
        ({"router": {"colour": 1}}, r"router keys \['colour'\] are unknown; expected some of"),
        ({"router": [("max_queued", 4)]}, "router .* is invalid; expected a table"),
        ({"report_period_s": 0.0}, "report_period_s 0.0 is invalid; expected > 0"),
        ({"report_period_s": 1.5}, "report_period_s 1.5 is invalid"),
        ({"report_period_s": "fast"}, "report_period_s 'fast' is invalid"),
        ({"seed": "seven"}, "seed 'seven' is invalid; expected an int or None"),
        ({"stale_after_s": 0.5}, r"stale_after_s 0.5 is invalid; expected >= 1 \(2 report periods"),
        ({"stale_after_s": 61}, "stale_after_s 61 is invalid; expected .* <= 60"),
        ({"stale_after_s": float("nan")}, "stale_after_s nan is invalid"),
        ({"stale_after_s": True}, "stale_after_s True is invalid; expected a number"),
        ({"stale_after_s": "3s"}, "stale_after_s '3s' is invalid; expected a number"),
        ({"seed": 1.5}, "seed 1.5 is invalid"),
        ({"topology": {"colour": 1}}, r"topology keys \['colour'\] are unknown; expected some"),
        ({"topology": {"release_demand": 2.0}}, "release_demand 2.0 is invalid"),
        ({"topology": [("window_s", 5)]}, "topology .* is invalid; expected a table"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(tmp_path, **values)


@pytest.mark.parametrize("mode", ["unmerged", "merged:acme/support@r1"])
def test_a_topology_needs_auto_engines(tmp_path: Path, mode: str) -> None:
    """Only an ``auto`` engine follows a dedication (``engine/mode_control.py``): with another
    mode the table was taken and the router steered the revision's traffic to a replica that
    never merged it, as if it had."""
    serve = ServeConfig(data_dir=tmp_path, mode=mode)
    with pytest.raises(ValueError, match=rf"^topology is set while the \[serve\] mode is '{mode}'"):
        FleetSettings(serve=serve, model_dir=tmp_path, topology={})
    FleetSettings(serve=serve, model_dir=tmp_path)  # no topology: any mode
    auto = ServeConfig(data_dir=tmp_path, mode="auto")
    assert FleetSettings(serve=auto, model_dir=tmp_path, topology={}).topology == {}


@pytest.mark.parametrize(
    ("replicas", "topology"), [(1, {}), (2, {"min_replicas": 3}), (3, {"min_replicas": 4})]
)
def test_a_topology_needs_its_min_replicas(
    tmp_path: Path, replicas: int, topology: dict[str, Any]
) -> None:
    """A fleet with fewer replicas than the topology's ``min_replicas`` never dedicates one
    (``decide_topology``; the count is fixed): on main the table was taken and did nothing."""
    auto = ServeConfig(data_dir=tmp_path, mode="auto")
    minimum = topology.get("min_replicas", 2)
    with pytest.raises(ValueError) as caught:
        FleetSettings(serve=auto, model_dir=tmp_path, engine_replicas=replicas, topology=topology)
    assert str(caught.value) == (
        f"topology is set with replicas {replicas}; expected replicas >= its min_replicas "
        f"{minimum} (fewer dedicate none), or no topology table"
    )
    FleetSettings(serve=auto, model_dir=tmp_path, engine_replicas=replicas)  # no topology: fine
    settings = FleetSettings(
        serve=auto, model_dir=tmp_path, engine_replicas=minimum, topology=topology
    )
    assert settings.engine_replicas == minimum


@pytest.mark.parametrize("policy", ["pow2", "ray_multiplex"])
def test_a_topology_needs_a_policy_that_follows_the_dedication(tmp_path: Path, policy: str) -> None:
    """Ray Serve's baselines never read a view's dedication: with them the table was taken and
    the dedicated replica merged a revision the router sent it no more often than elsewhere."""
    auto = ServeConfig(data_dir=tmp_path, mode="auto")
    with pytest.raises(
        ValueError, match=rf"^topology is set while the routing policy is '{policy}'"
    ):
        FleetSettings(serve=auto, model_dir=tmp_path, policy=policy, topology={})
    FleetSettings(serve=auto, model_dir=tmp_path, policy=policy)  # no topology: fine
    for affinity in ("affinity", "affinity_until_saturated"):
        FleetSettings(serve=auto, model_dir=tmp_path, policy=affinity, topology={})


@pytest.mark.parametrize(
    ("policy", "router", "unread"),
    [
        ("pow2", {"max_queued": 4, "recent_ttl_s": 5.0}, ["max_queued"]),
        ("ray_multiplex", {"max_queued": 4, "weight_l0": 90.0}, ["weight_l0"]),
        (
            "ray_multiplex",
            {"placement_k": 3, "session_ttl_s": 60.0},
            ["placement_k", "session_ttl_s"],
        ),
        (
            "affinity",
            {"weight_l0": 90.0, "penalty_per_queued": 2.0, "max_queued": 4, "recent_ttl_s": 5.0},
            ["max_queued"],
        ),
        (
            "affinity",
            {"weight_merged": 10.0, "placement_k": 3, "spread_after_s": 5.0, "max_sessions": 9},
            ["max_sessions", "placement_k", "spread_after_s"],
        ),
    ],
)
def test_router_keys_the_policy_does_not_read_are_refused(
    tmp_path: Path, policy: str, router: dict[str, Any], unread: list[str]
) -> None:
    """pow2 reads no router key (two random replicas, fewer ongoing requests), ray_multiplex
    only the saturation bounds, affinity only the residency weights and load penalties (no
    saturation, placement, reach or session): the rest were taken and did nothing."""
    with pytest.raises(ValueError, match=rf"^router keys {re.escape(str(unread))} are not read"):
        _settings(tmp_path, policy=policy, router=router)
    kept = {k: v for k, v in router.items() if k not in unread}
    assert _settings(tmp_path, policy=policy, router=kept).router == kept
    # affinity_until_saturated reads every key
    assert _settings(tmp_path, policy="affinity_until_saturated", router=router).router == router


def test_every_key_a_fleet_refuses_is_a_serve_key() -> None:
    assert set(NOT_IN_FLEET) <= {f.name for f in fields(ServeConfig)}


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("engine_process", {"engine_process": False}),
        ("stream_pause_bytes", {"stream_pause_bytes": 1 << 12}),
        ("max_stream_resumes", {"max_stream_resumes": 3}),
        ("max_paused_kv_fraction", {"max_paused_kv_fraction": 0.5}),
    ],
)
def test_serve_keys_a_fleet_does_not_read_are_refused(
    tmp_path: Path, name: str, values: dict[str, Any]
) -> None:
    config = ServeConfig(data_dir=tmp_path, **values)
    with pytest.raises(ValueError, match=f"config key {name} is not used by a fleet"):
        check_fleet_config(config)
    with pytest.raises(ValueError, match=name):
        FleetSettings(serve=config, model_dir=tmp_path)


def test_serve_keys_a_fleet_reads_pass(tmp_path: Path) -> None:
    check_fleet_config(ServeConfig(data_dir=tmp_path, port=9000, max_loras=4, torch_threads=2))


def test_the_listener_and_admin_socket_keys_pass(tmp_path: Path) -> None:
    """The ingress listens with serve's listener (``fleet/listener.py``): every key of it, and
    the admin socket's, is read in a fleet as in ``serve``."""
    values = {"header_read_timeout_s": 3.0, "max_connections_per_address": 9,
              "keep_alive_timeout_s": 9, "write_timeout_s": 3.0, "max_connections": 100,
              "max_header_bytes": 4096, "max_unauthenticated_connections": 7,
              "accepts_per_s_per_address": 9, "send_buffer_bytes": 1 << 20,
              "ipv6_address_prefix": 56, "admin_port": 9001, "admin_host": "127.0.0.1"}  # fmt: skip
    config = ServeConfig(data_dir=tmp_path, **values)
    check_fleet_config(config)
    settings = FleetSettings(serve=config, model_dir=tmp_path)
    assert settings.serve.header_read_timeout_s == 3.0 and settings.serve.admin_port == 9001


def test_fleet_keys_are_the_settings_a_user_sets() -> None:
    """``FLEET_KEYS`` (the ``[fleet]`` table, ``fleet.app:build``'s args) names every field of
    FleetSettings but those set another way (serve's configuration, the model it prepares, the
    one ingress); ``replicas`` sets ``engine_replicas``."""
    filled_in = {"serve", "model_dir", "ingress_replicas"}
    settable = {f.name for f in fields(FleetSettings)} - filled_in
    assert set(FLEET_KEYS) == settable - {"engine_replicas"} | {"replicas"}
    assert len(FLEET_KEYS) == len(set(FLEET_KEYS))


# --- the CLI ----------------------------------------------------------------------------------


def test_fleet_file_values_reads_the_fleet_table(tmp_path: Path) -> None:
    assert fleet_file_values(None) == {}
    path = tmp_path / "fleet.toml"
    path.write_text("[serve]\nport = 9000\n[fleet]\nreplicas = 3\nrouter = { max_queued = 4 }\n")
    assert fleet_file_values(path) == {"replicas": 3, "router": {"max_queued": 4}}
    path.write_text("[serve]\nport = 9000\n")
    assert fleet_file_values(path) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[fleet]\nreplica = 3\n", r"unknown \[fleet\] keys \['replica'\]"),
        ("fleet = 3\n", r"\[fleet\] is invalid; expected a table"),
        ("[fleet\n", "config file"),
    ],
)
def test_fleet_file_values_refuses_what_it_cannot_read(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        fleet_file_values(path)
    with pytest.raises(ValueError, match="config file"):
        fleet_file_values(tmp_path / "missing.toml")


def test_threads_are_the_cores_shared_out() -> None:
    assert default_threads_per_replica(2, 8) == 4
    assert default_threads_per_replica(3, 8) == 2
    assert default_threads_per_replica(4, 2) == 1
    assert default_threads_per_replica(2, None) == 1


class FakeControl:
    """``control.prepare`` and ``control.up`` replaced: records what ``fleet up`` asked for."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.prepared: list[ServeConfig] = []
        self.replicas_here: list[int | None] = []
        self.started: list[FleetSettings] = []

    def prepare(self, config: ServeConfig, replicas_here: int | None = None) -> control.Prepared:
        self.prepared.append(config)
        self.replicas_here.append(replicas_here)
        return control.Prepared(self.model_dir, "admin-key", False, {})

    def up(self, settings: FleetSettings, address: str | None, **_: Any) -> control.FleetRecord:
        self.started.append(settings)
        values = {
            "address": "127.0.0.1:1",
            "started_cluster": True,
            "process_group": None,
            "token_path": None,
            "url": "http://127.0.0.1:8000",
            "engine_replicas": settings.engine_replicas,
        }
        return control.FleetRecord(**{f.name: values[f.name] for f in fields(control.FleetRecord)})


@pytest.fixture
def fake_control(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeControl:
    fake = FakeControl(tmp_path)
    monkeypatch.setattr(control, "prepare", fake.prepare)
    monkeypatch.setattr(control, "up", fake.up)
    monkeypatch.setattr(control, "check_listen", lambda config: None)  # whatever holds 8000
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    return fake


def _up(tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["fleet", "up", "--data-dir", str(tmp_path), *args])


def test_up_help_lists_the_fleet_flags() -> None:
    result = CliRunner().invoke(app, ["fleet", "up", "--help"])
    assert result.exit_code == 0
    for flag in ("--replicas", "--policy", "--seed", "--address", "--threads", "--config"):
        assert flag in result.output


def test_up_takes_the_fleet_table_and_flags_over_it(
    tmp_path: Path, fake_control: FakeControl
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[serve]\nmax_loras = 4\n[fleet]\nreplicas = 3\npolicy = "ray_multiplex"\n'
        "report_period_s = 0.25\nstale_after_s = 2.5\nrouter = { max_queued = 4 }\n"
    )
    result = _up(tmp_path, "--config", str(path), "--replicas", "4", "--seed", "7")
    assert result.exit_code == 0, result.output
    (settings,) = fake_control.started
    assert (settings.engine_replicas, settings.policy, settings.seed) == (4, "ray_multiplex", 7)
    assert settings.router == {"max_queued": 4} and settings.report_period_s == 0.25
    assert settings.stale_bound_s == 2.5
    assert settings.serve.max_loras == 4 and settings.serve.torch_threads == 2  # 8 cores / 4
    assert settings.model_dir == fake_control.model_dir
    assert "4 engine replicas on a local Ray head it started" in result.output


def test_up_refuses_a_connection_cap_the_descriptors_cannot_hold(
    tmp_path: Path, fake_control: FakeControl
) -> None:
    """As ``serve`` does, before anything starts (the ingress's listener would fail in its
    replica, where only a /ready that never answers shows it)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard descriptor limit here")
    path = tmp_path / "fleet.toml"
    path.write_text(f"[serve]\nmax_connections = {hard}\n")
    result = _up(tmp_path, "--config", str(path))
    assert result.exit_code == 1, result.output
    assert f"max_connections {hard} is invalid here" in result.output
    assert not fake_control.prepared  # no key issued


def test_up_takes_the_listener_keys(tmp_path: Path, fake_control: FakeControl) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("[serve]\nheader_read_timeout_s = 3.0\nmax_connections_per_address = 9\n")
    result = _up(tmp_path, "--config", str(path))
    assert result.exit_code == 0, result.output
    (settings,) = fake_control.started
    assert settings.serve.header_read_timeout_s == 3.0
    assert settings.serve.max_connections_per_address == 9


def test_up_keeps_configured_threads(tmp_path: Path, fake_control: FakeControl) -> None:
    assert _up(tmp_path, "--threads", "3").exit_code == 0
    (settings,) = fake_control.started
    assert (settings.engine_replicas, settings.serve.torch_threads) == (2, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "policy 'nope' is invalid"),
        (["--replicas", "-1"], "replicas -1 is invalid"),
    ],
)
def test_up_refuses_bad_fleet_values_without_starting(
    tmp_path: Path, fake_control: FakeControl, args: list[str], message: str
) -> None:
    result = _up(tmp_path, *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "engine_replicas" not in result.output
    assert fake_control.started == []


def test_up_refuses_an_unknown_fleet_key(tmp_path: Path, fake_control: FakeControl) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("[serve]\nport = 9000\n[fleet]\nworkers = 3\n")
    result = _up(tmp_path, "--config", str(path))
    assert result.exit_code == 2
    assert "unknown [fleet] keys ['workers']" in " ".join(result.output.split())
    assert fake_control.prepared == [] and fake_control.started == []


def test_up_refuses_zero_replicas(tmp_path: Path, fake_control: FakeControl) -> None:
    result = _up(tmp_path, "--replicas", "0")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 2
    assert "replicas 0 is invalid" in " ".join(result.output.split())
    assert "engine_replicas" not in result.output  # the flag is --replicas


def test_up_checks_fleet_values_before_preparing(tmp_path: Path, fake_control: FakeControl) -> None:
    assert _up(tmp_path, "--policy", "nope").exit_code == 2
    assert fake_control.prepared == []


def test_up_reads_a_file_with_only_a_fleet_table(tmp_path: Path, fake_control: FakeControl) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("[fleet]\nreplicas = 3\n")
    result = _up(tmp_path, "--config", str(path))
    assert result.exit_code == 0, result.output
    assert fake_control.started[0].engine_replicas == 3


def test_up_declares_its_serve_options_as_serve_does() -> None:
    """Issue 26: ``fleet up`` re-declared ``serve``'s flags by hand, so a default or a type
    could diverge. Every option of both that sets a ServeConfig field is the one shared alias,
    and each sets the field of its name; ``threads`` (per replica) and ``policy`` (fleet up's is
    the routing policy, serve's the eviction policy) are the named exceptions."""
    import inspect

    from loraplex.cli.fleet import up_command
    from loraplex.cli.serve import serve_command
    from loraplex.cli.serve_options import SHARED

    up = inspect.signature(up_command, eval_str=True).parameters
    serve = inspect.signature(serve_command, eval_str=True).parameters
    serve_fields = {f.name for f in fields(ServeConfig)} | {"no_demo", "threads"}
    common = (set(up) & set(serve) & serve_fields) - {"threads", "policy"}
    locations = {"data_dir", "database_url", "store", "s3_endpoint"}  # cli/locations.py
    assert common - locations == set(SHARED)
    for name in common:
        assert up[name].annotation is serve[name].annotation, name  # one declaration
        assert up[name].default == serve[name].default, name
    fleet_only = set(up) - set(serve)
    assert fleet_only <= {"replicas", "policy", "seed", "address", "ready_timeout_s"}


def test_engine_resource_names_a_custom_ray_resource(tmp_path: Path) -> None:
    config = ServeConfig(data_dir=tmp_path)
    named = FleetSettings(serve=config, model_dir=tmp_path, engine_resource="loraplex_engine")
    assert named.engine_resource == "loraplex_engine"
    for bad in ("GPU", "CPU", "node:__internal_head__", "", "a b", 3):
        with pytest.raises(ValueError, match="engine_resource"):
            FleetSettings(serve=config, model_dir=tmp_path, engine_resource=bad)  # type: ignore[arg-type]


def test_up_takes_engine_resource_only_when_joining_a_cluster(
    tmp_path: Path, fake_control: FakeControl
) -> None:
    """The local head ``up`` starts advertises no custom resource: engines asking for one would
    never be placed, so the key is refused there by name, before any key is issued."""
    path = tmp_path / "fleet.toml"
    path.write_text('[fleet]\nengine_resource = "loraplex_engine"\n')
    result = _up(tmp_path, "--config", str(path))
    assert result.exit_code == 2 and "engine_resource" in result.output, result.output
    assert not fake_control.prepared and not fake_control.started
    result = _up(tmp_path, "--config", str(path), "--address", "10.0.0.1:6379")
    assert result.exit_code == 0, result.output
    (settings,) = fake_control.started
    assert settings.engine_resource == "loraplex_engine"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("max_model_len = 100000", "expected room for one max_model_len 100000 sequence"),
        ("max_num_seqs = 4\nclass_reserve_seqs = 4", "class_reserve_seqs 4 is invalid"),
        ('import_dir = "no-such-folder"', "expected a directory"),
        ('request_log_path = "no-such-folder/r.jsonl"', "its directory does not exist"),
        ("auto_warm = false\nmax_auto_gpu_slots = 1", "max_auto_gpu_slots 1 is set while"),
    ],
)
def test_up_runs_serves_engine_and_import_dir_checks_before_any_key(
    tmp_path: Path, fake_control: FakeControl, table: str, message: str
) -> None:
    """``serve`` refuses these before it issues a key; ``fleet up`` took them, issued the keys,
    and the replicas (or the first registration by path) failed later."""
    path = tmp_path / "fleet.toml"
    path.write_text(f"[serve]\n{table}\n")
    result = _up(tmp_path, "--config", str(path))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())  # the box's wrap
    assert fake_control.prepared == [] and fake_control.started == []


def test_up_checks_the_kv_caches_of_the_replicas_its_local_head_runs(
    tmp_path: Path, fake_control: FakeControl
) -> None:
    """The local Ray head runs every replica on this machine: ``prepare`` checks their KV caches
    together; on a joined cluster (``--address``) where they run is not known here."""
    assert _up(tmp_path, "--replicas", "3").exit_code == 0
    assert _up(tmp_path, "--replicas", "3", "--address", "10.0.0.1:6379").exit_code == 0
    assert fake_control.replicas_here == [3, None]


def test_prepare_refuses_what_serve_refuses_once_the_model_is_known(
    tmp_path: Path, demo_assets: DemoAssets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any key: a ``max_model_len`` past the model's context, GPU slot settings the
    engine refuses, and KV caches of the replicas here that this machine's memory cannot hold
    (``fleet up`` took them, issued the keys, and the replicas failed: out of memory, positions
    the model was never trained for, or no slot)."""
    data_dir = tmp_path / "data"
    model = demo_assets.base_model_dir
    config = ServeConfig(data_dir=data_dir, model=model, demo=False)
    each = config.kv_bytes(BaseModelSpec.from_dir(model))
    monkeypatch.setattr(serve_config, "memory_total_bytes", lambda: 3 * each)
    with pytest.raises(ValueError, match=r"^max_model_len 513 is invalid; expected at most 512"):
        control.prepare(replace(config, max_model_len=513), replicas_here=1)
    with pytest.raises(ValueError, match=r"^num_kv_blocks 1024 x block_size 16 is invalid with 4"):
        control.prepare(config, replicas_here=4)
    slot = config.slot_bytes(BaseModelSpec.from_dir(model))
    with pytest.raises(ValueError, match=r"^gpu_adapter_bytes 1 is invalid; expected at least one"):
        control.prepare(replace(config, gpu_adapter_bytes=1), replicas_here=1)
    two_slots = replace(config, gpu_adapter_bytes=2 * slot, max_auto_gpu_slots=2)
    with pytest.raises(ValueError, match=r"^max_auto_gpu_slots 2 is invalid; expected fewer than"):
        control.prepare(two_slots, replicas_here=1)
    assert not (data_dir / ADMIN_KEY_FILE).exists()
    assert control.prepare(config, replicas_here=3).new_admin_key  # 3 fit
