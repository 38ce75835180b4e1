"""The published API rules the rendered manifests are checked against, encoded once.

Sources (facts, re-stated): Kubernetes core ``v1`` / ``apps/v1`` / ``rbac.authorization.k8s.io/v1``
(object names, labels, Deployment selector and template, Service ports, RoleBinding roleRef);
Gateway API Inference Extension ``inference.networking.k8s.io/v1`` InferencePool
(site-src/reference/spec.md: ``selector.matchLabels`` 1-64 entries, ``targetPorts`` exactly one
``{number: 1-65535}``, ``endpointPickerRef`` with ``name`` and, for a Service, ``port``;
``failureMode`` FailOpen|FailClose); KubeRay ``ray.io/v1`` (raycluster_types.go: headGroupSpec
``rayStartParams`` + ``template``; each workerGroupSpecs item ``groupName``, ``minReplicas``,
``maxReplicas``, ``rayStartParams`` (a string map), ``template``; rayservice ``serveConfigV2`` is a
string, which Ray Serve reads as its config: ``applications``, each with a ``name``, an
``import_path`` and ``args``, a mapping the builder receives as it is); core ``v1``
ResourceRequirements (quantities, no request above its limit).
"""

from __future__ import annotations

import re
from typing import Any

import yaml  # type: ignore[import-untyped]

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
SUFFIXES = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
SUFFIXES |= {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# apiVersion -> kinds rendered under it, and the top-level fields each kind requires.
REQUIRED_TOP = {
    ("apps/v1", "Deployment"): ("spec",),
    ("v1", "Service"): ("spec",),
    ("v1", "ConfigMap"): ("data",),
    ("v1", "ServiceAccount"): (),
    ("rbac.authorization.k8s.io/v1", "Role"): ("rules",),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("roleRef", "subjects"),
    ("inference.networking.k8s.io/v1", "InferencePool"): ("spec",),
    ("ray.io/v1", "RayService"): ("spec",),
}


def check_metadata(doc: dict[str, Any], namespace: str) -> None:
    meta = doc["metadata"]
    assert DNS_SUBDOMAIN.match(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
    assert meta["namespace"] == namespace
    check_labels(meta.get("labels", {}))


def check_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        assert LABEL_KEY.match(key) and len(key.rpartition("/")[2]) <= 63, key
        assert isinstance(value, str) and LABEL_VALUE.match(value) and len(value) <= 63, value


def check_pod_template(template: dict[str, Any]) -> None:
    containers = template["spec"]["containers"]
    assert containers, "a pod needs a container"
    for container in containers:
        assert DNS_1035_LABEL.match(container["name"])
        assert isinstance(container["image"], str) and container["image"]
        for port in container.get("ports", []):
            assert 1 <= port["containerPort"] <= 65535
            assert len(port["name"]) <= 15, port["name"]  # IANA_SVC_NAME
        for env in container.get("env", []):
            assert ("value" in env) != ("valueFrom" in env), env
        check_resources(container.get("resources", {}))


def check_resources(resources: dict[str, Any]) -> None:
    """core/v1 ResourceRequirements: quantities (strings here), and no request above its limit
    (the API server refuses such a pod)."""
    assert set(resources) <= {"requests", "limits", "claims"}, resources
    for part in ("requests", "limits"):
        for value in resources.get(part, {}).values():
            assert isinstance(value, str) and QUANTITY.fullmatch(value), value
    for name, limit in resources.get("limits", {}).items():
        request = resources.get("requests", {}).get(name)
        assert request is None or _quantity(request) <= _quantity(limit), (name, request, limit)


def _quantity(text: str) -> float:
    match = QUANTITY.fullmatch(text)
    assert match is not None, text
    return float(match.group(1)) * SUFFIXES[match.group(2) or ""]


def check_deployment(doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    selector = spec["selector"]["matchLabels"]
    pod_labels = spec["template"]["metadata"]["labels"]
    # apps/v1: the selector must match the template's labels
    assert selector.items() <= pod_labels.items()
    assert spec["replicas"] >= 0
    check_pod_template(spec["template"])


def check_service(doc: dict[str, Any]) -> None:
    assert DNS_1035_LABEL.match(doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 63
    ports = doc["spec"]["ports"]
    assert len({p["name"] for p in ports}) == len(ports)
    for port in ports:
        assert 1 <= port["port"] <= 65535


def check_inference_pool(doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    match = spec["selector"]["matchLabels"]
    assert 1 <= len(match) <= 64
    check_labels(match)
    assert len(spec["targetPorts"]) == 1
    assert set(spec["targetPorts"][0]) == {"number"}
    assert 1 <= spec["targetPorts"][0]["number"] <= 65535
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref["name"] and ref.get("kind", "Service") == "Service"
    assert 1 <= ref["port"]["number"] <= 65535  # required when the referent is a Service
    assert ref.get("failureMode", "FailClose") in ("FailOpen", "FailClose")


def check_ray_service(doc: dict[str, Any]) -> None:
    spec = doc["spec"]
    assert isinstance(spec["serveConfigV2"], str)
    applications = yaml.safe_load(spec["serveConfigV2"])["applications"]
    for application in applications:
        assert isinstance(application["name"], str) and isinstance(application["import_path"], str)
        args = application.get("args", {})
        assert isinstance(args, dict) and all(isinstance(key, str) for key in args)
    cluster = spec["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    check_pod_template(head["template"])
    for group in cluster["workerGroupSpecs"]:
        assert group["groupName"]
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert isinstance(group["rayStartParams"], dict)
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        check_pod_template(group["template"])


def check_document(doc: dict[str, Any], namespace: str) -> None:
    """Every rule above that applies to ``doc``'s kind."""
    key = (doc["apiVersion"], doc["kind"])
    assert key in REQUIRED_TOP, key
    for name in REQUIRED_TOP[key]:
        assert name in doc, f"{key} without {name}"
    check_metadata(doc, namespace)
    checks = {
        "Deployment": check_deployment,
        "Service": check_service,
        "InferencePool": check_inference_pool,
        "RayService": check_ray_service,
    }
    if doc["kind"] in checks:
        checks[doc["kind"]](doc)
    if doc["kind"] == "RoleBinding":
        assert {"apiGroup", "kind", "name"} <= set(doc["roleRef"])
        assert all({"kind", "name"} <= set(s) for s in doc["subjects"])
    if doc["kind"] == "Role":
        assert all(rule["verbs"] and "apiGroups" in rule for rule in doc["rules"])
