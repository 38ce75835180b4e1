"""``loraplex k8s render``: Kubernetes manifests for a loraplex deployment (docs/kubernetes.md).

Reads flags only (no ``LORAPLEX_*`` variables: an exported database URL may carry a password,
and what is rendered should not depend on the shell it was rendered from). Every flag is a
``K8sSpec`` field; a value the spec refuses is reported against its flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from loraplex.deploy.spec import (
    DEFAULT_EPP_IMAGE,
    DEFAULT_HEAD_CPU,
    DEFAULT_HEAD_MEMORY,
    DEFAULT_RAY_VERSION,
    K8sSpec,
    SpecError,
)

k8s_app = typer.Typer(help="Kubernetes manifests.", no_args_is_help=True)
Opt = typer.Option


def register(app: typer.Typer) -> None:
    app.add_typer(k8s_app, name="k8s")


@k8s_app.command("render")
def render_command(
    *,
    image: Annotated[str, Opt(help="Container image with loraplex installed (required).")],
    store: Annotated[str, Opt(help="Artifact store, s3://bucket/prefix (required).")],
    name: Annotated[str, Opt(help="Name prefix of every object.")] = "loraplex",
    namespace: Annotated[str, Opt(help="Namespace of every object.")] = "default",
    replicas: Annotated[int, Opt(help="loraplex serve replicas (Ray: engine workers).")] = 2,
    port: Annotated[int, Opt(help="OpenAI API port (the pool's target port).")] = 8000,
    admin_port: Annotated[int, Opt(help="/admin and /metrics port (EPP scrapes it).")] = 8001,
    database_url: Annotated[
        str | None,
        Opt(help="postgresql://user@host/db without password (default: from the secret)"),
    ] = None,
    s3_endpoint: Annotated[str | None, Opt(help="S3-compatible endpoint URL.")] = None,
    secret: Annotated[
        str | None, Opt(help="Secret with the credentials (default: NAME-secrets)")
    ] = None,
    max_loras: Annotated[int, Opt(help="GPU adapter slots per replica.")] = 8,
    gpu: Annotated[bool, Opt("--gpu/--no-gpu", help="One GPU per replica, engine on cuda.")] = True,
    cpu: Annotated[str, Opt(help="CPU request per replica.")] = "4",
    memory: Annotated[str, Opt(help="Memory request and limit per replica.")] = "16Gi",
    model: Annotated[
        str | None, Opt(help="Base model directory in the image (default: demo model)")
    ] = None,
    epp_image: Annotated[str, Opt(help="Endpoint picker image.")] = DEFAULT_EPP_IMAGE,
    ray: Annotated[
        bool, Opt("--ray", help="A KubeRay RayService running the fleet instead.")
    ] = False,
    ray_version: Annotated[str, Opt(help="Ray release in the image.")] = DEFAULT_RAY_VERSION,
    head_cpu: Annotated[
        str | None, Opt(help=f"Ray head pod's CPU request (--ray) (default: {DEFAULT_HEAD_CPU})")
    ] = None,
    head_memory: Annotated[
        str | None,
        Opt(
            help=f"Ray head pod's memory request and limit (--ray) (default: {DEFAULT_HEAD_MEMORY})"
        ),
    ] = None,
    serve_config: Annotated[
        Path | None,
        Opt(
            help="TOML file: its 'serve' table (a ConfigMap; --ray: the builder's args) and, "
            "with --ray, its 'fleet' table (as fleet up --config)."
        ),
    ] = None,
    out: Annotated[
        Path | None, Opt(help="Directory for one YAML file per part (default: stdout)")
    ] = None,
) -> None:
    """Render the replica Deployment, Service, InferencePool and endpoint picker (or, with
    --ray, a RayService) as multi-document YAML."""
    from loraplex.deploy.render import render

    spec = _spec(
        image=image,
        store=store,
        name=name,
        namespace=namespace,
        replicas=replicas,
        port=port,
        admin_port=admin_port,
        database_url=database_url,
        s3_endpoint=s3_endpoint,
        secret=secret,
        max_loras=max_loras,
        gpu=gpu,
        cpu=cpu,
        memory=memory,
        model=model,
        epp_image=epp_image,
        ray=ray,
        ray_version=ray_version,
        head_cpu=head_cpu,
        head_memory=head_memory,
        serve_config_path=serve_config,
    )
    rendered = render(spec)
    if out is None:
        typer.echo(rendered.stream(), nl=False)
        return
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} exists and is not a directory", param_hint="--out")
    out.mkdir(parents=True, exist_ok=True)
    for file_name in sorted(rendered.files):
        (out / file_name).write_text(rendered.file_text(file_name), encoding="utf-8")
        typer.echo(f"wrote {out / file_name}", err=True)


def _spec(*, serve_config_path: Path | None, **values: Any) -> K8sSpec:
    """The file's ``[serve]`` and ``[fleet]`` tables, as ``fleet up --config`` reads them."""
    from loraplex.cli.fleet import fleet_file_values
    from loraplex.serve.config import read_config_file

    serve_values, fleet_values = {}, {}
    if serve_config_path is not None:
        try:
            serve_values = read_config_file(serve_config_path, ("fleet",))
            fleet_values = fleet_file_values(serve_config_path)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--serve-config") from exc
    try:
        return K8sSpec(serve_config=serve_values, fleet_config=fleet_values, **values)
    except SpecError as exc:
        flag = "--" + exc.field.replace("_", "-")
        raise typer.BadParameter(str(exc), param_hint=flag) from exc
