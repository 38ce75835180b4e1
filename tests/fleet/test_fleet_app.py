"""``loraplex.fleet.app``: the Serve application builder's arguments (RayService, serve run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from loraplex.demo.assets import DemoAssets
from loraplex.fleet.app import settings_from_args
from loraplex.fleet.deployments import (
    HEAD_NODE_RESOURCE,
    NODE_ID_LABEL,
    FleetListenerImpl,
    build_app,
)
from loraplex.fleet.settings import FleetSettings
from loraplex.serve.config import ServeConfig


def test_args_and_environment_make_the_settings(demo_assets: DemoAssets, tmp_path: Path) -> None:
    args = {
        "replicas": 3, "policy": "pow2", "max_loras": 2, "model": str(demo_assets.base_model_dir),
        "demo": False,
    }  # fmt: skip
    env = {"LORAPLEX_DATA_DIR": str(tmp_path), "LORAPLEX_ADMIN_KEY": "a" * 40}
    env["LORAPLEX_SHARED_STATE_URL"] = "redis://:pw@redis:6379/0"  # the Secret's, on a RayService
    settings = settings_from_args(args, env)
    assert settings.serve.shared_state_url == env["LORAPLEX_SHARED_STATE_URL"]
    assert settings.engine_replicas == 3 and settings.policy == "pow2"
    assert settings.serve.max_loras == 2 and settings.serve.data_dir == tmp_path
    assert settings.serve.admin_key == "a" * 40
    assert settings.model_dir == demo_assets.base_model_dir
    assert (tmp_path / "registry.db").exists() or any(tmp_path.iterdir())  # prepared


def test_an_unknown_arg_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_lora_slots"):
        settings_from_args({"max_lora_slots": 4}, {"LORAPLEX_DATA_DIR": str(tmp_path)})


def test_a_serve_key_the_fleet_cannot_honour_is_refused(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    args = {"model": str(demo_assets.base_model_dir), "engine_process": False, "demo": False}
    with pytest.raises(ValueError, match="engine_process"):
        settings_from_args(args, {"LORAPLEX_DATA_DIR": str(tmp_path)})


def test_the_ingress_listens_itself_on_the_head_node_or_the_node_given(tmp_path: Path) -> None:
    """The builder's application (``serve run``, a RayService) places the listening ingress on
    the Ray head (where KubeRay's Service points); ``fleet up`` on its own node."""
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME

    assert HEAD_NODE_RESOURCE == HEAD_NODE_RESOURCE_NAME  # Ray's name for it has not moved
    settings = FleetSettings(serve=ServeConfig(data_dir=tmp_path), model_dir=tmp_path)
    ingress = build_app(settings)._bound_deployment
    assert ingress.func_or_class is FleetListenerImpl
    assert ingress.ray_actor_options["resources"] == {HEAD_NODE_RESOURCE: 0.001}
    assert "label_selector" not in ingress.ray_actor_options
    pinned = build_app(settings, ingress_node="abc")._bound_deployment.ray_actor_options
    assert pinned["label_selector"] == {NODE_ID_LABEL: "abc"} and "resources" not in pinned


def test_the_rendered_ray_args_register_no_demo_tenants(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """``k8s render --ray`` without ``--model`` (the demo model): the builder prepares the model
    but registers no demo tenant in the shared registry (it did: keys issued, shown to nobody),
    as ``--no-demo`` keeps the Deployment path's replicas from doing."""
    from loraplex.deploy import K8sSpec
    from loraplex.deploy.ray import serve_application_args
    from loraplex.registry import open_registry
    from loraplex.serve.assembly import DEMO_DIR
    from loraplex.serve.engine_settings import registry_config

    args = serve_application_args(K8sSpec(image="i:1", store="s3://a/b", ray=True))
    args |= {"store": str(tmp_path / "store"), "device": "cpu"}  # no S3, no GPU here
    (tmp_path / DEMO_DIR).symlink_to(demo_assets.root)
    env = {"LORAPLEX_DATA_DIR": str(tmp_path), "LORAPLEX_ADMIN_KEY": "a" * 40}
    settings = settings_from_args(args, env)
    registry = open_registry(registry_config(settings.serve))
    try:
        assert registry.list_tenants() == []
    finally:
        registry.close()


def test_engines_ask_for_the_engine_resource_when_one_is_named(tmp_path: Path) -> None:
    """A replica that asks Ray for nothing can land on any node, the head included (Serve spreads
    replicas over every node: seen with 3 engines on a head and 3 workers); one unit of the
    ``engine_resource`` each keeps engines on the nodes that advertise it, one per unit."""
    config = ServeConfig(data_dir=tmp_path)

    def engine_options(settings: FleetSettings) -> dict[str, Any]:
        ingress = build_app(settings)._bound_deployment
        [engine] = [a for a in ingress.init_args if getattr(a, "_bound_deployment", None)
                    and a._bound_deployment.name == "EngineReplica"]  # fmt: skip
        return dict(engine._bound_deployment.ray_actor_options)

    assert engine_options(FleetSettings(serve=config, model_dir=tmp_path)) == {"num_cpus": 0}
    named = FleetSettings(serve=config, model_dir=tmp_path, engine_resource="loraplex_engine")
    assert engine_options(named) == {"num_cpus": 0, "resources": {"loraplex_engine": 1}}


def test_the_rendered_fleet_table_builds_the_fleet_it_names(
    demo_assets: DemoAssets, tmp_path: Path
) -> None:
    """``k8s render --ray`` with a ``[fleet]`` table: the builder, given the rendered args, builds
    engines routed with those keys; serve's ``policy`` (eviction) stays serve's."""
    import yaml  # type: ignore[import-untyped]

    from loraplex.deploy import K8sSpec, render
    from loraplex.deploy.ray import ENGINE_RESOURCE
    from loraplex.serve.assembly import DEMO_DIR

    fleet = {"policy": "affinity", "seed": 7, "report_period_s": 0.25, "stale_after_s": 3.0,
             "router": {"penalty_per_queued": 4.0}, "topology": {"min_replicas": 3}}  # fmt: skip
    spec = K8sSpec(
        image="i:1", store="s3://a/b", ray=True, gpu=False, replicas=3,
        serve_config={"policy": "lru", "mode": "auto"}, fleet_config=fleet,
    )  # fmt: skip
    [service] = [d for d in yaml.safe_load_all(render(spec).stream()) if d]
    [application] = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    args = application["args"] | {"store": str(tmp_path / "store")}  # no S3 here
    (tmp_path / DEMO_DIR).symlink_to(demo_assets.root)
    env = {"LORAPLEX_DATA_DIR": str(tmp_path), "LORAPLEX_ADMIN_KEY": "a" * 40}
    settings = settings_from_args(args, env)
    assert settings.serve.policy == "lru" and settings.engine_replicas == 3
    assert settings.engine_resource == ENGINE_RESOURCE
    ingress = build_app(settings)._bound_deployment
    [engine] = [a._bound_deployment for a in ingress.init_args
                if getattr(a, "_bound_deployment", None)
                and a._bound_deployment.name == "EngineReplica"]  # fmt: skip
    assert engine.num_replicas == 3
    assert engine.ray_actor_options["resources"] == {ENGINE_RESOURCE: 1}
    routing = engine._deployment_config.request_router_config
    assert routing.request_routing_stats_period_s == 0.25
    assert routing.request_router_kwargs == {
        "policy": "affinity", "router_config": {"penalty_per_queued": 4.0}, "seed": 7,
        "stale_after_s": 3.0,
        "topology": {"min_replicas": 3},
    }  # fmt: skip


def test_a_fleet_table_arg_takes_only_fleet_keys(tmp_path: Path) -> None:
    env = {"LORAPLEX_DATA_DIR": str(tmp_path)}
    with pytest.raises(ValueError, match="replica"):
        settings_from_args({"fleet": {"replica": 2}}, env)
    with pytest.raises(ValueError, match="expected a mapping"):
        settings_from_args({"fleet": "pow2"}, env)
    # beside a fleet table every key is serve's: a fleet key there is an unknown serve key
    with pytest.raises(ValueError, match="replicas"):
        settings_from_args({"fleet": {}, "replicas": 2}, env)
