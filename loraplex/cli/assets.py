"""``loraplex demo-assets``: generate (or reuse) the demo base model and adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def check_preset(preset: str, option: str = "--preset") -> None:
    """``--preset`` of every demo-set command: an unknown name is a usage error naming it, before
    anything is generated or started (``demo`` raised a traceback, ``qualify --self`` started a
    server first; ``bench modes --preset`` and ``bench cache --presets`` raised one too)."""
    from loraplex.demo.presets import PRESETS

    if preset not in PRESETS:
        raise typer.BadParameter(
            f"{preset!r} is not one of {', '.join(sorted(PRESETS))}", param_hint=option
        )


def preset_option(value: str) -> str:
    """``check_preset`` as a typer ``parser``: refused as it is parsed, before the command."""
    check_preset(value)
    return value


def register(app: typer.Typer) -> None:
    app.command("demo-assets")(demo_assets)


def demo_assets(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the asset set into.")],
    preset: Annotated[
        str, typer.Option("--preset", help="small (tests, demo) or large (benchmarks).")
    ] = "small",
    seed: Annotated[int, typer.Option("--seed", help="Generator seed.")] = 0,
) -> None:
    """Generate a tiny Llama base model and LoRA adapters for several tenants (cached)."""
    from loraplex.demo.assets import generate_demo_assets

    check_preset(preset)
    assets = generate_demo_assets(out, preset, seed)
    tenants = sorted({adapter.tenant for adapter in assets.adapters})
    typer.echo(
        f"base model {assets.base_model_name} (sha256 {assets.base_digest[:12]}) in "
        f"{assets.base_model_dir}"
    )
    typer.echo(
        f"{len(assets.adapters)} adapter revisions for tenants {', '.join(tenants)}; "
        f"manifest {assets.manifest_path}"
    )
