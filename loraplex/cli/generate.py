"""``loraplex generate``: offline generation for prompts, each with an adapter or the base model,
through the serving engine (``engine.offline``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from loraplex.dtypes import DTYPE_NAMES

if TYPE_CHECKING:
    from loraplex.engine.offline import OfflineConfig, OfflineRequest, OfflineResult

_DTYPES = DTYPE_NAMES
_BASE = "none"  # --adapter value meaning "base model only"


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_command)


def _pair_adapters(prompts: list[str], adapters: list[str]) -> list[Path | None]:
    if len(adapters) not in (0, 1, len(prompts)):
        raise typer.BadParameter(
            f"{len(adapters)} --adapter values for {len(prompts)} prompts; expected 0, 1 or "
            f"one per prompt (use '{_BASE}' for the base model)",
            param_hint="--adapter",
        )
    chosen = adapters * len(prompts) if len(adapters) == 1 else adapters or [_BASE] * len(prompts)
    return [None if a == _BASE else Path(a) for a in chosen]


def generate_command(
    *,
    model: Annotated[Path, typer.Option(help="Base model directory (Hugging Face layout).")],
    prompt: Annotated[list[str], typer.Option(help="Prompt text; repeat for a batch.")],
    adapter: Annotated[
        list[str] | None,
        typer.Option(help=f"PEFT adapter dir per prompt (or one for all); '{_BASE}' = base."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 32,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    top_k: Annotated[int | None, typer.Option(help="Keep the k most likely tokens.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of every request's sampler.")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string; repeatable.")] = None,
    dtype: Annotated[str, typer.Option(help=f"One of {', '.join(_DTYPES)}.")] = "float32",
    device: Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda.")] = "cpu",
    max_lora_rank: Annotated[int, typer.Option(help="Largest adapter rank accepted.")] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per result.")] = False,
) -> None:
    """Continue each --prompt with its --adapter (or the base model), as one mixed batch."""
    from loraplex.engine.offline import OfflineEngine, OfflineRequest
    from loraplex.errors import LoraplexError
    from loraplex.sampling import SamplingParams

    if dtype not in _DTYPES:
        raise typer.BadParameter(f"{dtype!r}; expected one of {_DTYPES}", param_hint="--dtype")
    adapter_dirs = _pair_adapters(prompt, adapter or [])
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=tuple(stop or ()),
        )
        config = _offline_config(dtype, device, adapter_dirs, max_lora_rank)
        requests = [OfflineRequest(p, a, params) for p, a in zip(prompt, adapter_dirs, strict=True)]
        with OfflineEngine(model, config) as engine:
            results = engine.generate(requests)
    except (LoraplexError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from exc
    for request, result in zip(requests, results, strict=True):
        typer.echo(_render(request, result, as_json))


def _offline_config(
    dtype: str, device: str, adapter_dirs: list[Path | None], max_lora_rank: int
) -> OfflineConfig:
    from loraplex.engine.offline import OfflineConfig

    return OfflineConfig(
        dtype=dtype,
        device=device,
        max_loras=max(1, len({d for d in adapter_dirs if d is not None})),
        max_lora_rank=max_lora_rank,
    )


def _render(request: OfflineRequest, result: OfflineResult, as_json: bool) -> str:
    name = _BASE if request.adapter_dir is None else str(request.adapter_dir)
    if not as_json:
        return f"[{name}] ({result.finish_reason}) {request.prompt!r} -> {result.text!r}"
    record = {
        "prompt": request.prompt,
        "adapter": None if request.adapter_dir is None else name,
        "text": result.text,
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
    }
    return json.dumps(record)
