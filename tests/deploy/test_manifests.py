"""The rendered manifests against the published APIs (k8s_api.py) and against loraplex itself:
selectors match pods, ports line up, probes hit the server's real paths, the endpoint picker
reads metrics loraplex exports, credentials stay in the Secret, flags reach ``loraplex serve``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
import yaml  # type: ignore[import-untyped]
from k8s_api import check_document

from loraplex.artifacts.identity import AdapterKey
from loraplex.cli import app
from loraplex.cli.serve import serve_settings
from loraplex.deploy import K8sSpec, render
from loraplex.deploy.pool import EPP_METRIC_FLAGS
from loraplex.engine.protocol import EngineLoad
from loraplex.serve.config import read_config_file
from loraplex.server.app import create_app
from loraplex.server.history import HistoryConfig
from loraplex.server.listeners import is_admin_path
from loraplex.server.metrics_collectors import EngineCollector

BASE: dict[str, Any] = {"image": "ghcr.io/acme/loraplex:1.0", "store": "s3://adapters/prod"}
# every fleet key a RayService's operator sets (``[fleet]`` of --serve-config), none a default
FLEET_TABLE: dict[str, Any] = {
    "policy": "affinity_until_saturated",  # reads every router key (pow2 reads none of them)
    "seed": 7,
    "report_period_s": 0.25,
    "stale_after_s": 3.0,
    "router": {"max_queued": 4, "weight_l0": 90.0},
    "topology": {"min_replicas": 3},
}
SPECS = {
    "default": K8sSpec(**BASE),
    "full": K8sSpec(
        **BASE,
        name="lpx-eu",
        namespace="serving",
        replicas=5,
        port=9000,
        admin_port=9100,
        database_url="postgresql://loraplex@db.serving:5432/registry",
        s3_endpoint="http://minio.serving:9000",
        secret="lpx-credentials",
        max_loras=24,
        gpu=False,
        cpu="2500m",
        memory="12Gi",
        model="/models/llama",
        serve_config={"max_num_seqs": 16, "policy": "lru", "num_kv_blocks": 2048},
    ),
    "ray": K8sSpec(**BASE, ray=True, replicas=3),
}
CREDENTIAL_VARS = {
    "LORAPLEX_ADMIN_KEY",
    "PGPASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "LORAPLEX_SHARED_STATE_URL",
}


def docs(spec: K8sSpec) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render(spec).stream()) if d is not None]


def one(found: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    [doc] = [
        d
        for d in found
        if d["kind"] == kind and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return doc


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(found) == 1
    return found[0]


def port_number(ctr: dict[str, Any], port: int | str) -> int:
    """A Service targetPort or probe port, by number or by the container port's name."""
    numbers = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    return port if isinstance(port, int) else numbers[port]


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_document_follows_its_published_api(case: str) -> None:
    spec = SPECS[case]
    found = docs(spec)
    for doc in found:
        check_document(doc, spec.namespace)
    names = [(d["kind"], d["metadata"]["name"]) for d in found]
    assert len(set(names)) == len(names), names
    kinds = sorted(d["kind"] for d in found)
    if spec.ray:
        assert kinds == ["RayService"]
    else:
        assert kinds.count("Deployment") == 2 and kinds.count("InferencePool") == 1


@pytest.mark.parametrize("case", ["default", "full"])
def test_selectors_match_exactly_their_pods(case: str) -> None:
    found = docs(SPECS[case])
    replica = one(found, "Deployment", "replica")
    epp = one(found, "Deployment", "endpoint-picker")
    replica_labels = replica["spec"]["template"]["metadata"]["labels"]
    epp_labels = epp["spec"]["template"]["metadata"]["labels"]
    pool_selector = one(found, "InferencePool", "inference-pool")["spec"]["selector"]["matchLabels"]
    service_selector = one(found, "Service", "replica")["spec"]["selector"]
    epp_service_selector = one(found, "Service", "endpoint-picker")["spec"]["selector"]
    assert pool_selector.items() <= replica_labels.items()
    assert service_selector.items() <= replica_labels.items()
    assert epp_service_selector.items() <= epp_labels.items()
    # the pool and the replica Service never select the picker, and the picker's never a replica
    assert not pool_selector.items() <= epp_labels.items()
    assert not service_selector.items() <= epp_labels.items()
    assert not epp_service_selector.items() <= replica_labels.items()


@pytest.mark.parametrize("case", ["default", "full"])
def test_ports_line_up(case: str) -> None:
    spec = SPECS[case]
    found = docs(spec)
    replica = container(one(found, "Deployment", "replica"))
    epp = container(one(found, "Deployment", "endpoint-picker"))
    service = one(found, "Service", "replica")
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["http"]["port"] == spec.port
    assert port_number(replica, by_name["http"]["targetPort"]) == spec.port
    assert port_number(replica, by_name["admin"]["targetPort"]) == spec.admin_port
    pool = one(found, "InferencePool", "inference-pool")["spec"]
    assert pool["targetPorts"] == [{"number": port_number(replica, "http")}]
    epp_service = one(found, "Service", "endpoint-picker")
    assert pool["endpointPickerRef"]["name"] == epp_service["metadata"]["name"]
    [ext_proc] = [
        p
        for p in epp_service["spec"]["ports"]
        if p["port"] == pool["endpointPickerRef"]["port"]["number"]
    ]
    assert port_number(epp, ext_proc["targetPort"]) == ext_proc["port"]
    args = epp["args"]
    grpc_port = int(args[args.index("--grpc-port") + 1])
    assert grpc_port == ext_proc["port"]
    scraped = int(args[args.index("--model-server-metrics-port") + 1])
    assert scraped == port_number(replica, "admin") == spec.admin_port
    assert (
        args[args.index("--pool-name") + 1]
        == one(found, "InferencePool", "inference-pool")["metadata"]["name"]
    )
    assert args[args.index("--pool-namespace") + 1] == spec.namespace


def test_probes_hit_the_servers_real_paths_on_the_public_port() -> None:
    found = docs(SPECS["full"])
    replica = container(one(found, "Deployment", "replica"))
    # Only the route table is read: the app needs no real dependencies for it (the live page's
    # history is built with the app, from the metrics' traffic tally and the history config;
    # /ready's shared ping is built from the registry's ping).
    history = HistoryConfig()
    registry = SimpleNamespace(ping=lambda: None)
    deps = SimpleNamespace(
        fleet=object(), metrics=SimpleNamespace(traffic=None), history=history, registry=registry
    )
    routes = {getattr(route, "path", None) for route in create_app(deps).routes}  # type: ignore[arg-type]
    live, ready = replica["livenessProbe"]["httpGet"], replica["readinessProbe"]["httpGet"]
    assert (live["path"], ready["path"]) == ("/health", "/ready")
    for probe in (live, ready):
        assert probe["path"] in routes
        assert not is_admin_path(probe["path"])  # so answered on the public listener
        assert port_number(replica, probe["port"]) == SPECS["full"].port
    epp = container(one(found, "Deployment", "endpoint-picker"))
    path = epp["args"][epp["args"].index("--model-server-metrics-path") + 1]
    assert path in routes and is_admin_path(path)  # hence scraped on the admin port...
    assert "--metrics-public" in replica["args"]  # ...without a credential (the EPP has none)


class _Engine:
    """The one EngineClient method EngineCollector calls."""

    def load_snapshot(self) -> EngineLoad:
        key = AdapterKey("b" * 64, "acme", "support", "v1", "a" * 64, 1)
        return EngineLoad(1, 2, 3, 0.5, (key,), (), 8, 30)


def test_the_endpoint_picker_reads_metrics_loraplex_exports() -> None:
    found = docs(SPECS["default"])
    args = container(one(found, "Deployment", "endpoint-picker"))["args"]
    collector = EngineCollector(_Engine(), lambda: 0.0, "base")  # type: ignore[arg-type]
    exported = {m.name for m in collector.collect()}
    for flag, metric in EPP_METRIC_FLAGS.items():
        assert args[args.index(f"--{flag}") + 1] == metric
        assert metric in exported, metric
    info = [m for m in collector.collect() if "lora" in m.name]
    assert set(info[0].samples[0].labels) == {
        "max_lora",
        "running_lora_adapters",
        "waiting_lora_adapters",
    }


def test_the_endpoint_picker_is_configured_for_lora_affinity() -> None:
    found = docs(SPECS["default"])
    config_map = one(found, "ConfigMap", "endpoint-picker")
    deployment = one(found, "Deployment", "endpoint-picker")
    [(file_name, text)] = config_map["data"].items()
    config = yaml.safe_load(text)
    assert (config["apiVersion"], config["kind"]) == (
        "inference.networking.x-k8s.io/v1alpha1",
        "EndpointPickerConfig",
    )
    types = {p["type"] for p in config["plugins"]}
    assert "lora-affinity-scorer" in types
    [profile] = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert set(weights) == types  # every plugin is used, every reference is defined
    assert weights["lora-affinity-scorer"] == max(w for w in weights.values() if w)
    ctr = container(deployment)
    [mount] = ctr["volumeMounts"]
    [volume] = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert volume["name"] == mount["name"]
    assert (
        ctr["args"][ctr["args"].index("--config-file") + 1] == f"{mount['mountPath']}/{file_name}"
    )
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    binding = one(found, "RoleBinding", "endpoint-picker")
    assert binding["subjects"][0]["name"] == account
    rules = one(found, "Role", "endpoint-picker")["rules"]
    assert {"pods", "inferencepools"} <= {r for rule in rules for r in rule["resources"]}
    assert all(set(rule["verbs"]) == {"get", "watch", "list"} for rule in rules)


@pytest.mark.parametrize("case", sorted(SPECS))
def test_credentials_come_only_from_the_named_secret(case: str) -> None:
    spec = SPECS[case]
    envs = [env for doc in docs(spec) for env in _all_env(doc)]
    assert envs
    for env in envs:
        if env["name"] in CREDENTIAL_VARS:
            ref = env["valueFrom"]["secretKeyRef"]
            assert ref["name"] == spec.secret_name and "value" not in env
    database = [env for env in envs if env["name"] == "LORAPLEX_DATABASE_URL"]
    for env in database:
        if spec.database_url is None:
            assert env["valueFrom"]["secretKeyRef"]["key"] == "database-url"
        else:
            assert env["value"] == spec.database_url
    assert {"LORAPLEX_ADMIN_KEY", "LORAPLEX_DATABASE_URL"} <= {e["name"] for e in envs}
    # the Redis of shared rate limits may carry a password: from the Secret, optional
    shared = [env for env in envs if env["name"] == "LORAPLEX_SHARED_STATE_URL"]
    assert shared and all(
        env["valueFrom"]["secretKeyRef"] | {"name": None}
        == {"name": None, "key": "shared-state-url", "optional": True}
        for env in shared
    )


def _all_env(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        found = list(node.get("env", [])) if isinstance(node.get("env"), list) else []
        return found + [e for value in node.values() for e in _all_env(value)]
    if isinstance(node, list):
        return [e for value in node for e in _all_env(value)]
    return []


@pytest.mark.parametrize("case", ["default", "full"])
def test_container_args_are_what_loraplex_serve_parses(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SPECS[case]
    found = docs(spec)
    replica = container(one(found, "Deployment", "replica"))
    assert replica["command"] == ["loraplex"] and replica["args"][0] == "serve"
    args = list(replica["args"][1:])
    if spec.serve_config:  # the mounted file, here at a temporary path
        config_map = one(found, "ConfigMap", "replica")
        [(file_name, text)] = config_map["data"].items()
        (tmp_path / file_name).write_text(text, encoding="utf-8")
        args[args.index("--config") + 1] = str(tmp_path / file_name)
        assert read_config_file(tmp_path / file_name) == dict(spec.serve_config)
    # the pod's environment as the Secret would fill it
    monkeypatch.setenv("LORAPLEX_DATABASE_URL", spec.database_url or "postgresql://u:p@db/r")
    monkeypatch.setenv("LORAPLEX_ADMIN_KEY", "k" * 32)
    command = typer.main.get_command(app)
    serve = command.get_command(command.make_context("loraplex", ["serve"]), "serve")  # type: ignore[attr-defined]
    settings = serve_settings(serve.make_context("serve", args).params, {})
    assert (settings.host, settings.port, settings.admin_port) == (
        "0.0.0.0",
        spec.port,
        spec.admin_port,
    )
    assert settings.store == spec.store and settings.s3_endpoint == spec.s3_endpoint
    assert settings.max_loras == spec.max_loras
    assert settings.device == ("cuda" if spec.gpu else "cpu")
    assert settings.metrics_public and not settings.demo
    assert str(settings.data_dir) == replica["volumeMounts"][0]["mountPath"]
    assert settings.database_url == (spec.database_url or "postgresql://u:p@db/r")
    assert settings.admin_key == "k" * 32
    assert str(settings.model) == str(spec.model)
    for key, value in spec.serve_config.items():
        assert getattr(settings, key) == value


def test_ray_is_rendered_only_when_asked_with_its_note() -> None:
    assert all(d["kind"] != "RayService" for d in docs(SPECS["full"]))
    assert "RayService runs" not in render(SPECS["full"]).stream()
    rendered = render(SPECS["ray"])
    assert "The RayService runs loraplex.fleet.app:build" in rendered.stream()
    [service] = docs(SPECS["ray"])
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    [application] = serve_config["applications"]
    assert application["import_path"] == "loraplex.fleet.app:build"
    assert application["args"]["fleet"]["replicas"] == 3 == SPECS["ray"].replicas
    assert application["args"]["store"] == SPECS["ray"].store
    cluster = service["spec"]["rayClusterConfig"]
    [workers] = cluster["workerGroupSpecs"]
    assert workers["replicas"] == 3
    [worker] = workers["template"]["spec"]["containers"]
    [head] = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in head["resources"]["limits"]
    # no Ray proxy: the ingress listens itself (loraplex's listener) on the head's serve port,
    # where KubeRay's Service points; every listener bound of serve holds there
    assert serve_config["proxy_location"] == "Disabled" and "http_options" not in serve_config
    assert port_number(head, "serve") == application["args"]["port"]
    assert application["args"]["host"] == "0.0.0.0"
    # /admin and /metrics on the admin socket of the same listener, as in the Deployment path
    assert port_number(head, "admin") == application["args"]["admin_port"] == 8001
    # workers carry a readiness probe of their own (the raylet's), so KubeRay adds none on the
    # serve port, where no worker listens
    probe = worker["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/api/local_raylet_healthz", 52365)
    assert "readinessProbe" not in head


def test_ray_passes_the_serve_config_keys_to_the_builder() -> None:
    # with --serve-config the RayService's builder gets the keys (settings_from_args reads them
    # as serve keys); before, the Ray path dropped them without a word
    values = {"max_num_seqs": 16, "policy": "lru", "num_kv_blocks": 2048}
    [service] = docs(K8sSpec(**BASE, ray=True, serve_config=values))
    [application] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert {key: application["args"][key] for key in values} == values


def test_ray_passes_the_fleet_table_to_the_builder_beside_the_serve_keys() -> None:
    """The ``[fleet]`` table's keys go into the builder's ``fleet`` mapping, beside the engine
    count and resource the manifests set; ``policy`` is a key of both tables and each keeps its
    own (the routing policy there, the eviction policy here)."""
    from loraplex.deploy.ray import ENGINE_RESOURCE

    serve = {"policy": "lru", "mode": "auto"}  # the topology needs auto engines
    # 3 engine replicas, the topology's min_replicas (2 would never dedicate: refused)
    spec = K8sSpec(**BASE, ray=True, replicas=3, serve_config=serve, fleet_config=FLEET_TABLE)
    found = docs(spec)
    for doc in found:
        check_document(doc, spec.namespace)
    [service] = found
    [application] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    args = application["args"]
    assert args["policy"] == "lru"
    assert args["fleet"] == FLEET_TABLE | {"replicas": 3, "engine_resource": ENGINE_RESOURCE}


def test_the_ray_head_is_sized_for_the_ingress_and_engines_stay_on_workers() -> None:
    """The head pod runs Ray's control plane and the ingress, never an engine: it asks for its
    own CPU and memory (``--head-cpu``, ``--head-memory``), not a worker's; engines ask for one
    unit of a resource only workers advertise (Serve spreads replicas that ask for nothing over
    every node, the head included), and the head offers no CPU to anything else."""
    import shlex

    from loraplex.deploy.ray import ENGINE_RESOURCE
    from loraplex.deploy.spec import DEFAULT_HEAD_CPU, DEFAULT_HEAD_MEMORY

    for spec, head_cpu, head_memory in (
        (SPECS["ray"], DEFAULT_HEAD_CPU, DEFAULT_HEAD_MEMORY),
        (K8sSpec(**BASE, ray=True, head_cpu="1500m", head_memory="6Gi"), "1500m", "6Gi"),
    ):
        [service] = docs(spec)
        cluster = service["spec"]["rayClusterConfig"]
        [head] = cluster["headGroupSpec"]["template"]["spec"]["containers"]
        [group] = cluster["workerGroupSpecs"]
        [worker] = group["template"]["spec"]["containers"]
        assert head["resources"] == {
            "requests": {"cpu": head_cpu, "memory": head_memory},
            "limits": {"memory": head_memory},
        }
        assert worker["resources"]["requests"] == {"cpu": spec.cpu, "memory": spec.memory}
        assert head["resources"]["requests"] != worker["resources"]["requests"]
        assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        assert "resources" not in cluster["headGroupSpec"]["rayStartParams"]
        # KubeRay writes the value into ray start's shell command line as it is
        [flag] = shlex.split("--resources=" + group["rayStartParams"]["resources"])
        assert json.loads(flag.removeprefix("--resources=")) == {ENGINE_RESOURCE: 1}
        [application] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
        assert application["args"]["fleet"]["engine_resource"] == ENGINE_RESOURCE


def test_the_resource_check_refuses_what_the_api_server_would() -> None:
    from k8s_api import check_resources

    check_resources({"requests": {"cpu": "500m", "memory": "4Gi"}, "limits": {"memory": "4Gi"}})
    for bad in (
        {"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}},  # request above limit
        {"requests": {"cpu": 4}},  # not a quantity string
        {"requests": {"memory": "4 GB"}},
        {"request": {"cpu": "1"}},  # no such field
    ):
        with pytest.raises(AssertionError):
            check_resources(bad)
