"""``loraplex demo``: the offline demo the README's first command runs.

Generates (or reuses) the demo model and adapters, validates every adapter revision against the
base model, then answers every revision's probe prompt, plus the base model on one of them, as
one mixed batch through the serving engine (``engine.offline``, no HTTP), and checks each
continuation is the one that revision was trained to give.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from loraplex.demo.manifest import DemoAssets
    from loraplex.engine.offline import OfflineEngine

DEFAULT_ASSETS = Path(".loraplex-assets")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    out: Annotated[
        Path | None, typer.Option(help="Asset directory (default: .loraplex-assets/demo-PRESET)")
    ] = None,
    preset: Annotated[str, typer.Option(help="Demo model size: small or large.")] = "small",
    seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
    max_lora_rank: Annotated[int, typer.Option(help="Largest adapter rank accepted.")] = 128,
) -> None:
    """Generate the demo assets, validate every adapter and answer every probe in one batch."""
    from loraplex.cli.assets import check_preset
    from loraplex.demo.assets import generate_demo_assets
    from loraplex.engine.offline import OfflineConfig, OfflineEngine

    check_preset(preset)
    try:  # before the minutes of a first generation: it was a traceback after them
        config = OfflineConfig(max_lora_rank=max_lora_rank)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--max-lora-rank") from None
    assets = generate_demo_assets(out or DEFAULT_ASSETS / f"demo-{preset}", preset, seed)
    typer.echo(f"assets: {assets.root} ({len(assets.adapters)} adapter revisions)")
    config = replace(config, max_loras=len(assets.adapters))
    with OfflineEngine(assets.base_model_dir, config) as engine:
        typer.echo(f"base model: {assets.base_model_name}, digest {engine.base_spec.digest[:16]}")
        _validate_all(assets, engine, max_lora_rank)
        failures = _answer_probes(assets, engine)
    if failures:
        typer.echo(f"{failures} probe(s) answered wrongly", err=True)
        raise typer.Exit(1)
    typer.echo("every revision answered its own probe; the base model did not")


def _validate_all(assets: DemoAssets, engine: OfflineEngine, max_lora_rank: int) -> None:
    from loraplex.artifacts.validate import validate_adapter_dir

    for adapter in assets.adapters:
        validated = validate_adapter_dir(adapter.path, engine.base_spec, max_lora_rank)
        key = validated.key(adapter.tenant, adapter.name, adapter.revision)
        typer.echo(
            f"  valid  {key.ref:<30} r<={validated.max_rank:<3} {validated.dtype} "
            f"{validated.tensor_bytes / 1e6:6.2f} MB  sha256 {key.adapter_digest[:12]}"
        )


def _answer_probes(assets: DemoAssets, engine: OfflineEngine) -> int:
    """Run every probe (and the base model on the first) as one batch; count wrong answers."""
    from loraplex.engine.offline import OfflineRequest
    from loraplex.sampling import SamplingParams

    requests = [
        OfflineRequest(a.probe_prompt, a.path, SamplingParams(max_tokens=a.probe_max_tokens))
        for a in assets.adapters
    ]
    first = assets.adapters[0]
    requests.append(OfflineRequest(first.probe_prompt, None, requests[0].params))
    results = engine.generate(requests)
    typer.echo(f"one mixed batch of {len(requests)} sequences:")
    failures = 0
    for adapter, result in zip(assets.adapters, results, strict=False):
        ok = result.text == adapter.expected_continuation
        failures += not ok
        ref = f"{adapter.tenant}/{adapter.name}@{adapter.revision}"
        _report(ok, ref, adapter.probe_prompt, result.text)
    base_ok = results[-1].text != first.expected_continuation
    _report(base_ok, "(base model)", first.probe_prompt, results[-1].text)
    return failures + (not base_ok)


def _report(ok: bool, who: str, prompt: str, text: str) -> None:
    typer.echo(f"  {'ok' if ok else 'WRONG':<5}  {who:<30} {prompt!r} -> {text!r}")
