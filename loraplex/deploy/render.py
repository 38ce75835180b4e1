"""All manifests of one deployment, grouped by file, with the comment that must travel with them.

Two paths: replicas behind an InferencePool (default), or, with ``ray``, a RayService (the Ray
fleet). They are alternatives, each serving with its own GPUs; rendering both would run two
fleets.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.deploy.pool import pool_manifests
from loraplex.deploy.ray import RAY_NOTE, ray_manifests
from loraplex.deploy.replica import Manifest, replica_manifests
from loraplex.deploy.spec import K8sSpec
from loraplex.deploy.yaml_text import dump_documents


@dataclass(frozen=True)
class Rendered:
    """Manifests by file name (``kubectl apply -f DIR`` order is file-name order) and the header
    comment every file and the stdout stream start with."""

    files: dict[str, list[Manifest]]  # file name -> its documents, in apply order
    comment: tuple[str, ...]  # the notes: the Secret to create, what must exist first

    def documents(self) -> list[Manifest]:
        return [document for name in sorted(self.files) for document in self.files[name]]

    def stream(self) -> str:
        """Every document in one multi-document YAML stream."""
        return dump_documents(self.documents(), self.comment)

    def file_text(self, name: str) -> str:
        return dump_documents(self.files[name], self.comment)


def render(spec: K8sSpec) -> Rendered:
    comment = [
        "Rendered by `loraplex k8s render` (docs/kubernetes.md).",
        f"Secret {spec.secret_name!r} is referenced, never rendered: create it first, keys",
        "admin-key (required), " + _database_keys(spec) + ",",
        "aws-access-key-id and aws-secret-access-key (optional; absent: boto3's default chain),",
        "shared-state-url (optional: the Redis of shared rate limits; absent: per replica).",
    ]
    if spec.ray:
        comment += ["Needs the KubeRay operator (RayService, ray.io/v1).", *RAY_NOTE]
        return Rendered({"30-rayservice.yaml": ray_manifests(spec)}, tuple(comment))
    comment += [
        "Needs the Gateway API Inference Extension CRDs (InferencePool,",
        f"inference.networking.k8s.io/v1) and an HTTPRoute to InferencePool {spec.name!r}.",
    ]
    files = {
        "10-replicas.yaml": replica_manifests(spec),
        "20-inference-pool.yaml": pool_manifests(spec),
    }
    return Rendered(files, tuple(comment))


def _database_keys(spec: K8sSpec) -> str:
    if spec.database_url is None:
        return "database-url (required: postgresql://user:password@host:port/db)"
    return "database-password (optional; the password of --database-url)"
