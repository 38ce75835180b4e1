"""The Ray path: a KubeRay ``RayService`` (``ray.io/v1``) running loraplex's Serve application.

The application is ``loraplex.fleet.app:build`` (docs/fleet.md): its ``args`` are the fleet's
keys and ``serve`` configuration keys; credentials come from the pods' environment. Ray Serve
runs no HTTP proxy (``proxy_location: Disabled``): the ingress listens itself, with loraplex's
listener, on the head pod's serve port (``host``/``port`` args), where KubeRay's Serve Service
points, and answers KubeRay's ``/-/healthz`` check there (``fleet/listener.py``).

KubeRay facts this relies on: the operator puts the head pod in the RayService's Serve Service
while ``GET /-/healthz`` on its ``serve`` container port answers 200; it gives each worker of a
RayService a readiness probe on that path only when the container has no readiness probe of its
own, so the workers (no listener: engines only) carry one on the raylet's health.

API facts (KubeRay): ``spec.serveConfigV2`` is the Serve config as a YAML string
(``applications``: name, route_prefix, import_path, args); ``spec.rayClusterConfig`` is a
RayCluster spec whose ``headGroupSpec`` needs ``rayStartParams`` and ``template``, and each
``workerGroupSpecs`` item ``groupName``, ``minReplicas``, ``maxReplicas``, ``rayStartParams`` and
``template``.
"""

from __future__ import annotations

import json
from typing import Any

from loraplex.deploy.replica import Manifest, metadata, pod_resources, registry_env
from loraplex.deploy.spec import RAY_CLIENT_PORT, RAY_DASHBOARD_PORT, RAY_GCS_PORT, K8sSpec

RAY_API = "ray.io/v1"
FLEET_IMPORT_PATH = "loraplex.fleet.app:build"
RAY_AGENT_PORT = 52365  # Ray's dashboard agent on every node (``--dashboard-agent-listen-port``)
# a worker is ready while its raylet is (the check KubeRay's own worker probe starts with;
# the agent answers 200 ``success``, or 503)
RAYLET_HEALTH_PATH = "/api/local_raylet_healthz"
# Ray custom resource only engine workers advertise (one unit each) and each engine replica asks
# for (the fleet's ``engine_resource``): Serve spreads replicas that ask for nothing over every
# node, the head included, where no GPU is and the pod is sized for the ingress alone.
ENGINE_RESOURCE = "loraplex_engine"
RAY_NOTE = (
    f"The RayService runs {FLEET_IMPORT_PATH} (docs/fleet.md); the model directory must be",
    "the same path on every node (in the image or a shared volume).",
)


def ray_manifests(spec: K8sSpec) -> list[Manifest]:
    return [
        {
            "apiVersion": RAY_API,
            "kind": "RayService",
            "metadata": metadata(spec, spec.name, "ray"),
            "spec": {
                "serveConfigV2": serve_config_text(spec),
                "rayClusterConfig": _cluster(spec),
            },
        }
    ]


def serve_application_args(spec: K8sSpec) -> dict[str, Any]:
    """What the builder receives; credentials stay in the pods' environment. The ingress listens
    on every interface of the head pod: the API on its ``serve`` port, ``/admin`` and
    ``/metrics`` on its ``admin`` port (as ``serve --admin-port`` in the Deployment path).
    ``--serve-config``'s keys come first (checked by the spec; none is one set here), its
    ``[fleet]`` keys in the ``fleet`` mapping, with the engine count and resource (``policy`` is
    a key of both: the builder reads the two apart as ``fleet up`` reads the file's two tables).
    ``demo`` is off, as ``--no-demo`` in the Deployment path: the builder would otherwise register
    the demo tenants in the shared registry and issue them keys nobody is shown."""
    args: dict[str, Any] = dict(spec.serve_config) | {
        "demo": False,
        "host": "0.0.0.0",
        "port": spec.port,
        "admin_port": spec.admin_port,
        "max_loras": spec.max_loras,
        "store": spec.store,
        "device": "cuda" if spec.gpu else "cpu",
        "fleet": dict(spec.fleet_config)
        | {"replicas": spec.replicas, "engine_resource": ENGINE_RESOURCE},
    }
    if spec.s3_endpoint is not None:
        args["s3_endpoint"] = spec.s3_endpoint
    if spec.model is not None:
        args["model"] = spec.model
    return args


def serve_config_text(spec: K8sSpec) -> str:
    """The Serve config (YAML text): no HTTP proxy, one application at route ``/``."""
    lines = [
        "proxy_location: Disabled",
        "applications:",
        "- name: loraplex",
        "  route_prefix: /",
        f"  import_path: {FLEET_IMPORT_PATH}",
        "  args:",
    ]
    lines += [
        f"    {key}: {json.dumps(value)}" for key, value in serve_application_args(spec).items()
    ]
    return "\n".join(lines) + "\n"


def _cluster(spec: K8sSpec) -> Manifest:
    head_ports = [
        {"name": "gcs", "containerPort": RAY_GCS_PORT},
        {"name": "dashboard", "containerPort": RAY_DASHBOARD_PORT},
        {"name": "client", "containerPort": RAY_CLIENT_PORT},
        {"name": "serve", "containerPort": spec.port},
        {"name": "admin", "containerPort": spec.admin_port},
    ]
    head_cpu, head_memory = spec.head_resources
    head = _container(spec, "ray-head", head_ports, pod_resources(head_cpu, head_memory, gpu=False))
    worker = _container(spec, "ray-worker", [], pod_resources(spec.cpu, spec.memory, spec.gpu))
    worker["readinessProbe"] = {
        "httpGet": {"path": RAYLET_HEALTH_PATH, "port": RAY_AGENT_PORT},
        "periodSeconds": 5,
        "timeoutSeconds": 2,
        "failureThreshold": 10,
    }
    return {
        "rayVersion": spec.ray_version,
        "headGroupSpec": {
            # the head runs the control plane and the ingress (its listener on the serve port),
            # never an engine (no GPU, no engine resource) nor anything asking for a CPU
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"},
            "template": {"spec": {"containers": [head]}},
        },
        "workerGroupSpecs": [
            {
                "groupName": "engine",
                "replicas": spec.replicas,
                "minReplicas": spec.replicas,
                "maxReplicas": spec.replicas,
                "rayStartParams": {"resources": _ray_resources({ENGINE_RESOURCE: 1})},
                "template": {"spec": {"containers": [worker]}},
            }
        ],
    }


def _ray_resources(resources: dict[str, int]) -> str:
    """``rayStartParams.resources``: KubeRay puts the value into ``ray start``'s shell command
    line as it is, so the JSON travels inside double quotes with its own quotes escaped."""
    return '"' + json.dumps(resources).replace('"', '\\"') + '"'


def _container(spec: K8sSpec, name: str, ports: list[Manifest], resources: Manifest) -> Manifest:
    container: Manifest = {
        "name": name,
        "image": spec.image,
        "env": registry_env(spec),
        "resources": resources,
    }
    if ports:
        container["ports"] = ports
    return container
