"""The replica Deployment (``loraplex serve`` pods), its Service and its serve ConfigMap.

Core APIs: ``apps/v1`` Deployment, ``v1`` Service and ConfigMap. Credentials reach the pods only
as ``secretKeyRef`` environment variables naming keys of one Secret that this command never
writes (docs/kubernetes.md lists the keys); nothing secret is ever in a rendered manifest.
"""

from __future__ import annotations

from typing import Any

from loraplex.deploy.serve_file import POD_DATA_DIR, toml_text
from loraplex.deploy.spec import K8sSpec

Manifest = dict[str, Any]
HEALTH_PATH = "/health"  # liveness: 200 while the HTTP server answers (engine restarts included)
READY_PATH = "/ready"  # readiness: 200 once the engine takes requests and the registry answers
METRICS_PATH = "/metrics"  # on the admin port (``--admin-port``), public (``--metrics-public``)
SERVE_CONFIG_DIR = "/etc/loraplex"
SERVE_CONFIG_FILE = "serve.toml"
# Secret keys: required ones make the pod fail to start (CreateContainerConfigError) when missing.
SECRET_KEYS = {
    "admin-key": ("LORAPLEX_ADMIN_KEY", False),  # one admin credential for every replica
    "database-url": ("LORAPLEX_DATABASE_URL", False),  # unless --database-url is given
    "database-password": ("PGPASSWORD", True),  # libpq's password for a --database-url
    "aws-access-key-id": ("AWS_ACCESS_KEY_ID", True),  # absent: boto3's chain (IRSA, ...)
    "aws-secret-access-key": ("AWS_SECRET_ACCESS_KEY", True),
    # the Redis of shared rate limits (docs/operations.md), password and all; absent: per replica
    "shared-state-url": ("LORAPLEX_SHARED_STATE_URL", True),
}


def labels(spec: K8sSpec, component: str) -> dict[str, str]:
    """The pod labels a selector matches: the app, this deployment (``name``), the component."""
    return {
        "app.kubernetes.io/name": "loraplex",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
    }


def metadata(spec: K8sSpec, name: str, component: str) -> Manifest:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec, component)}


def registry_env(spec: K8sSpec) -> list[Manifest]:
    """Where the registry and artifacts are: plain values for what is not secret, secret
    references for the rest (the Secret itself is the operator's)."""
    env: list[Manifest] = []
    for key, (variable, optional) in SECRET_KEYS.items():
        if key == "database-url" and spec.database_url is not None:
            env.append({"name": variable, "value": spec.database_url})
            continue
        if key == "database-password" and spec.database_url is None:
            continue  # the URL in the secret carries its own password
        ref = {"name": spec.secret_name, "key": key, "optional": optional}
        env.append({"name": variable, "valueFrom": {"secretKeyRef": ref}})
    return env


def serve_args(spec: K8sSpec) -> list[str]:
    """``loraplex serve``'s argv in the pod (``LORAPLEX_*`` variables carry the rest)."""
    args = ["serve", "--host", "0.0.0.0", "--port", str(spec.port)]
    args += ["--admin-port", str(spec.admin_port), "--metrics-public", "--no-demo"]
    args += ["--data-dir", POD_DATA_DIR, "--store", spec.store]
    if spec.s3_endpoint is not None:
        args += ["--s3-endpoint", spec.s3_endpoint]
    args += ["--max-loras", str(spec.max_loras), "--device", "cuda" if spec.gpu else "cpu"]
    if spec.model is not None:
        args += ["--model", spec.model]
    if spec.serve_config:
        args += ["--config", f"{SERVE_CONFIG_DIR}/{SERVE_CONFIG_FILE}"]
    return args


def replica_manifests(spec: K8sSpec) -> list[Manifest]:
    """The serve ConfigMap (only with serve settings), the Deployment and its Service."""
    found = [_deployment(spec), _service(spec)]
    if spec.serve_config:
        config = {SERVE_CONFIG_FILE: toml_text(spec.serve_config)}
        found.insert(0, config_map(spec, f"{spec.name}-serve", "replica", config))
    return found


def config_map(spec: K8sSpec, name: str, component: str, data: dict[str, str]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(spec, name, component),
        "data": data,
    }


def _deployment(spec: K8sSpec) -> Manifest:
    volumes: list[Manifest] = [{"name": "data", "emptyDir": {}}]
    mounts: list[Manifest] = [{"name": "data", "mountPath": POD_DATA_DIR}]
    if spec.serve_config:
        volumes.append({"name": "serve-config", "configMap": {"name": f"{spec.name}-serve"}})
        mounts.append({"name": "serve-config", "mountPath": SERVE_CONFIG_DIR, "readOnly": True})
    container = {
        "name": "loraplex",
        "image": spec.image,
        "command": ["loraplex"],
        "args": serve_args(spec),
        "ports": [
            {"name": "http", "containerPort": spec.port, "protocol": "TCP"},
            {"name": "admin", "containerPort": spec.admin_port, "protocol": "TCP"},
        ],
        "env": registry_env(spec),
        "livenessProbe": _probe(HEALTH_PATH, failures=3),
        "readinessProbe": _probe(READY_PATH, failures=1),
        "resources": pod_resources(spec.cpu, spec.memory, spec.gpu),
        "volumeMounts": mounts,
    }
    pod_labels = labels(spec, "replica")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, spec.name, "replica"),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [container], "volumes": volumes},
            },
        },
    }


def _probe(path: str, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": 5,
        "failureThreshold": failures,
    }


def pod_resources(cpu: str, memory: str, gpu: bool) -> Manifest:
    """CPU and memory requested (memory also the limit); one GPU with ``gpu``."""
    limits = {"memory": memory} | ({"nvidia.com/gpu": "1"} if gpu else {})
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}


def _service(spec: K8sSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.name, "replica"),
        "spec": {
            "type": "ClusterIP",
            "selector": labels(spec, "replica"),
            "ports": [
                {"name": "http", "port": spec.port, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "admin",
                    "port": spec.admin_port,
                    "targetPort": "admin",
                    "protocol": "TCP",
                },
            ],
        },
    }
