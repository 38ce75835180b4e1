"""What ``loraplex k8s render`` renders: one frozen, validated record.

Torch-free. Every field is one flag of the command (``field`` -> ``--field``, ``_`` as ``-``), so a
``SpecError`` names the flag by naming its field (``fleet_config``, the ``[fleet]`` table of the
``--serve-config`` file, is reported as ``serve_config``). Values are checked here, before
anything is rendered, against what Kubernetes would refuse later (names, ports, quantities) and
against what would deploy but not work (a registry or store that the replicas cannot share, a
secret inline).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from loraplex.deploy.fleet_file import check_fleet_values
from loraplex.deploy.serve_file import ServeFileError, check_serve_values
from loraplex.serve.config.keys import NOT_IN_FLEET
from loraplex.urls import http_url

# Derived names add at most this suffix ("-epp-config"), and a Service name is a DNS label (63).
MAX_NAME_CHARS = 40
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A Service name is an RFC 1035 label: it starts with a letter.
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes resource.Quantity, decimal and binary suffixes (no exponent form).
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
# Image references, URLs and paths are printable ASCII without spaces or quotes.
TOKEN = re.compile(r"^[!#-~]+$")
POSTGRES_SCHEMES = ("postgresql", "postgres")
DEFAULT_EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.2.1"
DEFAULT_RAY_VERSION = "2.60.0"  # the Ray release issue 14 names for the fleet
# The Ray head pod (Ray's GCS, dashboard, Serve controller, the ingress and the fleet board; no
# engine): see docs/kubernetes.md for what these were measured against.
DEFAULT_HEAD_CPU = "1"
DEFAULT_HEAD_MEMORY = "4Gi"
RAY_GCS_PORT = 6379
RAY_DASHBOARD_PORT = 8265
RAY_CLIENT_PORT = 10001


class SpecError(ValueError):
    """A render setting that cannot work; ``field`` is the ``K8sSpec`` field (and so the flag)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class K8sSpec:
    """One loraplex deployment on Kubernetes. Field names are the flag names with ``_``."""

    image: str  # container image with loraplex installed (and ray[serve] for the Ray path)
    store: str  # artifact store, s3://bucket/prefix: every replica reads the same artifacts
    name: str = "loraplex"  # prefix of every object's name; the app.kubernetes.io/instance label
    namespace: str = "default"
    replicas: int = 2  # loraplex serve replicas (Ray path: engine worker pods)
    port: int = 8000  # the OpenAI API port (the InferencePool's target port)
    admin_port: int = 8001  # /admin and /metrics (scraped by the endpoint picker)
    database_url: str | None = None  # postgresql://user@host/db, no password; None: from secret
    s3_endpoint: str | None = None  # S3-compatible endpoint URL; None: AWS
    secret: str | None = None  # the Secret holding credentials; None: "<name>-secrets"
    max_loras: int = 8  # GPU adapter slots per replica
    gpu: bool = True  # one nvidia.com/gpu per replica, engine on cuda
    cpu: str = "4"  # CPU request per replica
    memory: str = "16Gi"  # memory request and limit per replica
    model: str | None = None  # base model directory inside the image; None: the demo model
    epp_image: str = DEFAULT_EPP_IMAGE  # Gateway API Inference Extension endpoint picker
    ray: bool = False  # render a KubeRay RayService instead of Deployment + InferencePool
    ray_version: str = DEFAULT_RAY_VERSION  # Ray release inside the image (RayService only)
    # the Ray head pod's CPU request and memory request and limit (RayService only: it runs Ray's
    # control plane and the ingress, no engine); None: DEFAULT_HEAD_CPU / DEFAULT_HEAD_MEMORY
    head_cpu: str | None = None
    head_memory: str | None = None
    # ``loraplex serve`` TOML keys (a [serve] table read with serve.config), rendered into a
    # ConfigMap; the keys this command sets itself are refused (RESERVED_SERVE_KEYS)
    serve_config: Mapping[str, Any] = field(default_factory=dict)
    # the same file's [fleet] table (``fleet up --config``'s): the fleet's own keys, into the
    # RayService builder's args; ray only (the Deployment path runs no fleet)
    fleet_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_names()
        self._check_numbers()
        self._check_locations()
        for name in ("image", "epp_image"):
            _token(name, getattr(self, name))
        self._check_head()
        self._check_path_flags()
        for name in ("cpu", "memory"):
            if not QUANTITY.fullmatch(getattr(self, name)):
                raise SpecError(
                    name,
                    f"{name} {getattr(self, name)!r} is invalid; expected a Kubernetes "
                    "quantity such as 4, 500m, 16Gi",
                )
        if self.model is not None and not (_token("model", self.model).startswith("/")):
            raise SpecError("model", f"model {self.model!r} is invalid; expected an absolute path")
        if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", self.ray_version):
            raise SpecError(
                "ray_version", f"ray_version {self.ray_version!r} is invalid; expected X.Y.Z"
            )
        self._check_config_file()

    def _check_config_file(self) -> None:
        """``--serve-config``'s tables; a SpecError for either names that flag."""
        try:
            serve = check_serve_values(self.serve_config, self.max_loras)
        except ServeFileError as exc:
            raise SpecError("serve_config", str(exc)) from exc
        unread = sorted(set(self.serve_config) & set(NOT_IN_FLEET)) if self.ray else []
        if unread:  # a RayService is a fleet: each engine replica runs its engine in its process
            raise SpecError(
                "serve_config",
                f"serve config key {unread[0]!r} is not used by a fleet (ray); remove it",
            )
        if not self.ray:
            if self.fleet_config:
                raise SpecError(
                    "serve_config",
                    f"[fleet] keys {sorted(self.fleet_config)} are used only with ray (the "
                    "Deployment path runs no fleet); remove them",
                )
            return
        try:
            check_fleet_values(self.fleet_config, serve, self.replicas)
        except ServeFileError as exc:
            raise SpecError("serve_config", str(exc)) from exc

    @property
    def secret_name(self) -> str:
        return self.secret or f"{self.name}-secrets"

    @property
    def head_resources(self) -> tuple[str, str]:
        """The Ray head pod's (CPU, memory) in force."""
        return (self.head_cpu or DEFAULT_HEAD_CPU, self.head_memory or DEFAULT_HEAD_MEMORY)

    def _check_path_flags(self) -> None:
        """A flag of the path not rendered would be dropped: refused, naming it."""
        if self.ray and self.epp_image != DEFAULT_EPP_IMAGE:
            raise SpecError(
                "epp_image", "epp_image is not used with ray (no endpoint picker); remove it"
            )
        if not self.ray and self.ray_version != DEFAULT_RAY_VERSION:
            raise SpecError("ray_version", "ray_version is used only with ray; remove it")

    def _check_head(self) -> None:
        for name in ("head_cpu", "head_memory"):
            value = getattr(self, name)
            if value is None:
                continue
            if not self.ray:  # no head pod without a RayService: refused, never ignored
                raise SpecError(name, f"{name} is used only with ray (the head pod); remove it")
            if not QUANTITY.fullmatch(value):
                raise SpecError(
                    name, f"{name} {value!r} is invalid; expected a Kubernetes quantity"
                )

    def _check_names(self) -> None:
        if not DNS_1035_LABEL.fullmatch(self.name) or len(self.name) > MAX_NAME_CHARS:
            raise SpecError(
                "name",
                f"name {self.name!r} is invalid; expected a lowercase DNS label of at "
                f"most {MAX_NAME_CHARS} characters (a-z, 0-9, '-'; a letter first)",
            )
        if not DNS_LABEL.fullmatch(self.namespace) or len(self.namespace) > 63:
            raise SpecError(
                "namespace", f"namespace {self.namespace!r} is invalid; expected a DNS label"
            )
        if self.secret is not None and (
            not DNS_SUBDOMAIN.fullmatch(self.secret) or len(self.secret) > 253
        ):
            raise SpecError("secret", f"secret {self.secret!r} is invalid; expected a DNS name")

    def _check_numbers(self) -> None:
        for name in ("replicas", "max_loras"):
            if getattr(self, name) < 1:
                raise SpecError(name, f"{name} {getattr(self, name)} is invalid; expected >= 1")
        for name in ("port", "admin_port"):
            if not 1 <= getattr(self, name) <= 65535:
                raise SpecError(name, f"{name} {getattr(self, name)} is invalid; expected 1-65535")
        ray_ports = (RAY_GCS_PORT, RAY_DASHBOARD_PORT, RAY_CLIENT_PORT)
        for name in ("port", "admin_port"):  # both on the Ray head pod, beside Ray's own
            value = getattr(self, name)
            if self.ray and value in ray_ports:
                raise SpecError(
                    name, f"{name} {value} is invalid with ray; expected none of {ray_ports}"
                )
        if self.admin_port == self.port:
            raise SpecError(
                "admin_port",
                f"admin_port {self.admin_port} is invalid; expected another port "
                f"than port {self.port}",
            )

    def _check_locations(self) -> None:
        bucket = _token("store", self.store).removeprefix("s3://").partition("/")[0]
        if not self.store.startswith("s3://") or not bucket:
            raise SpecError(
                "store",
                f"store {self.store!r} is invalid; expected s3://bucket/prefix (pods "
                "have no shared disk, every replica must read the same artifact store)",
            )
        endpoint = self.s3_endpoint
        if endpoint is not None and not http_url(
            _token("s3_endpoint", endpoint), credentials=False
        ):
            raise SpecError(
                "s3_endpoint",
                f"s3_endpoint {endpoint!r} is invalid; expected "
                "http(s)://host[:port] without credentials (they come from the secret)",
            )
        if self.database_url is not None:
            _check_database_url(_token("database_url", self.database_url, quote=False))


def _token(name: str, value: str, quote: bool = True) -> str:
    if not TOKEN.fullmatch(value):
        shown = f" {value[:64]!r}" if quote else ""  # a database URL may hold a password
        raise SpecError(name, f"{name}{shown} is invalid; expected printable ASCII without spaces")
    return value


def _check_database_url(url: str) -> None:
    """A PostgreSQL URL that carries no secret: manifests are committed and shown in logs."""
    parts = urlsplit(url)
    if parts.scheme not in POSTGRES_SCHEMES or not parts.hostname:
        raise SpecError(
            "database_url",
            f"database_url scheme {parts.scheme!r} is invalid; expected "
            "postgresql://user@host:port/db (replicas must share one registry database)",
        )
    if parts.password is not None or "password" in parse_qs(parts.query):
        raise SpecError(
            "database_url",
            "database_url holds a password; expected none inline: put the "
            "password under the secret's key 'database-password' (or the whole URL under "
            "'database-url' and leave --database-url out)",
        )
