"""The ``InferencePool`` over the replicas and its endpoint picker (EPP), configured for LoRA
affinity.

API facts (Gateway API Inference Extension): ``inference.networking.k8s.io/v1`` InferencePool,
spec ``selector.matchLabels`` (the replica pods' labels), ``targetPorts`` (exactly one ``number``:
the OpenAI port) and ``endpointPickerRef`` (a Service and its port). The EPP reads its plugins
from an ``EndpointPickerConfig`` (``inference.networking.x-k8s.io/v1alpha1``) file and scrapes
each pod's Prometheus endpoint for the model-server metrics loraplex exports under vLLM's names.
loraplex serves ``/metrics`` only on the admin port, so the EPP is pointed there.
"""

from __future__ import annotations

from loraplex.deploy.replica import METRICS_PATH, Manifest, config_map, labels, metadata
from loraplex.deploy.spec import K8sSpec

POOL_API = "inference.networking.k8s.io/v1"
EPP_CONFIG_API = "inference.networking.x-k8s.io/v1alpha1"
EPP_GRPC_PORT = 9002  # ext-proc, called by the gateway
EPP_HEALTH_PORT = 9003  # gRPC health, service "inference-extension"
EPP_METRICS_PORT = 9090
EPP_CONFIG_FILE = "epp-config.yaml"
# The model-server protocol metrics the EPP reads; loraplex exports each (server/metrics.py).
EPP_METRIC_FLAGS = {
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
}
# Scorer weights: adapter affinity first (a replica running the adapter's requests has it in a
# GPU slot; room for one more adapter next: docs/kubernetes.md), then queue depth
# and KV-cache pressure, so a replica holding the adapter still loses once it is saturated.
SCORER_WEIGHTS = {"lora-affinity-scorer": 3, "queue-scorer": 2, "kv-cache-utilization-scorer": 1}


def epp_name(spec: K8sSpec) -> str:
    return f"{spec.name}-epp"


def pool_manifests(spec: K8sSpec) -> list[Manifest]:
    """InferencePool, then the EPP's account, role, binding, config, Deployment and Service."""
    return [
        _inference_pool(spec),
        _service_account(spec),
        _role(spec),
        _role_binding(spec),
        config_map(spec, f"{epp_name(spec)}-config", "endpoint-picker", _epp_config()),
        _epp_deployment(spec),
        _epp_service(spec),
    ]


def _inference_pool(spec: K8sSpec) -> Manifest:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": metadata(spec, spec.name, "inference-pool"),
        "spec": {
            "selector": {"matchLabels": labels(spec, "replica")},
            "targetPorts": [{"number": spec.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp_name(spec),
                "port": {"number": EPP_GRPC_PORT},
                "failureMode": "FailClose",
            },
        },
    }


def _epp_config() -> dict[str, str]:
    """The EndpointPickerConfig text: the three scorers, weighted, and a max-score picker."""
    plugins = [*SCORER_WEIGHTS, "max-score-picker"]
    lines = [f"apiVersion: {EPP_CONFIG_API}", "kind: EndpointPickerConfig", "plugins:"]
    lines += [f"- type: {plugin}" for plugin in plugins]
    lines += ["schedulingProfiles:", "- name: default", "  plugins:"]
    for plugin in plugins:
        lines.append(f"  - pluginRef: {plugin}")
        if plugin in SCORER_WEIGHTS:
            lines.append(f"    weight: {SCORER_WEIGHTS[plugin]}")
    return {EPP_CONFIG_FILE: "\n".join(lines) + "\n"}


def _service_account(spec: K8sSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(spec, epp_name(spec), "endpoint-picker"),
    }


def _role(spec: K8sSpec) -> Manifest:
    """Read-only: the EPP watches the pool's pods, the pool and its objectives."""
    read = ["get", "watch", "list"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(spec, epp_name(spec), "endpoint-picker"),
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
            {
                "apiGroups": ["inference.networking.k8s.io"],
                "resources": ["inferencepools"],
                "verbs": read,
            },
            {
                "apiGroups": ["inference.networking.x-k8s.io"],
                "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                "verbs": read,
            },
        ],
    }


def _role_binding(spec: K8sSpec) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(spec, epp_name(spec), "endpoint-picker"),
        "subjects": [
            {"kind": "ServiceAccount", "name": epp_name(spec), "namespace": spec.namespace}
        ],
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": epp_name(spec),
        },
    }


def epp_args(spec: K8sSpec) -> list[str]:
    args = ["--pool-name", spec.name, "--pool-namespace", spec.namespace]
    args += ["--config-file", f"/config/{EPP_CONFIG_FILE}"]
    args += ["--grpc-port", str(EPP_GRPC_PORT), "--grpc-health-port", str(EPP_HEALTH_PORT)]
    args += ["--metrics-port", str(EPP_METRICS_PORT)]
    args += ["--model-server-metrics-port", str(spec.admin_port)]
    args += ["--model-server-metrics-path", METRICS_PATH]
    for flag, metric in EPP_METRIC_FLAGS.items():
        args += [f"--{flag}", metric]
    return args


def _epp_deployment(spec: K8sSpec) -> Manifest:
    health = {
        "grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"},
        "initialDelaySeconds": 5,
        "periodSeconds": 10,
    }
    container = {
        "name": "epp",
        "image": spec.epp_image,
        "args": epp_args(spec),
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT},
        ],
        "livenessProbe": health,
        "readinessProbe": health,
        "volumeMounts": [{"name": "config", "mountPath": "/config", "readOnly": True}],
    }
    pod_labels = labels(spec, "endpoint-picker")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, epp_name(spec), "endpoint-picker"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": epp_name(spec),
                    "containers": [container],
                    "volumes": [
                        {"name": "config", "configMap": {"name": f"{epp_name(spec)}-config"}}
                    ],
                },
            },
        },
    }


def _epp_service(spec: K8sSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, epp_name(spec), "endpoint-picker"),
        "spec": {
            "type": "ClusterIP",
            "selector": labels(spec, "endpoint-picker"),
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "port": EPP_GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "http2",
                },
                {"name": "metrics", "port": EPP_METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }
