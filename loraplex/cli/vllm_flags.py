"""``loraplex serve``'s usage error names each vLLM flag of its command line with what to use
instead (the table: ``serve/config/vllm.py``). It refuses them as click refuses any unknown
option; a migrating user's ``vllm serve BASE --enable-lora --lora-modules sql=/p`` was ``No such
option: --enable-lora (Possible options: --max-loras)`` alone, one flag per attempt, with
nothing that said where adapters, the base model's name or the API key had gone.
"""

from __future__ import annotations

from collections.abc import Sequence

from typer._click import core as click_core  # typer 0.29 vendors click: its errors
from typer._click import exceptions as click_errors
from typer.core import TyperCommand

from loraplex.serve.config.vllm import MODEL_ARGUMENT, VLLM_ONLY_FLAGS


def vllm_hints(args: Sequence[str]) -> list[str]:
    """One line per vLLM-only flag among ``args`` (``--flag`` or ``--flag=value``), in their
    order, each once; and the base model given as vLLM's leading argument."""
    hints: list[str] = []
    if args and not args[0].startswith("-"):
        hints.append(MODEL_ARGUMENT)
    seen: set[str] = set()
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in VLLM_ONLY_FLAGS and flag not in seen:
            seen.add(flag)
            hints.append(f"{flag}: {VLLM_ONLY_FLAGS[flag]}")
    return hints


class VllmAwareCommand(TyperCommand):
    """A command whose usage error, when its arguments hold vLLM flags, names each of them
    with what to use instead (``loraplex serve``)."""

    def parse_args(self, ctx: click_core.Context, args: list[str]) -> list[str]:
        given = list(args)  # click consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except click_errors.UsageError as exc:
            hints = vllm_hints(given)
            if not hints:
                raise
            lines = "\n".join(f"  {hint}" for hint in hints)
            head = exc.format_message()
            if isinstance(exc, click_errors.NoSuchOption) and exc.option_name in VLLM_ONLY_FLAGS:
                head = exc.message  # click's near names (--enable-lora: --max-loras) mislead
            raise click_errors.UsageError(
                f"{head}\nvLLM's flags that loraplex serve does not take, and "
                f"what to use instead (docs/migrating-from-vllm.md):\n{lines}",
                ctx,
            ) from None
