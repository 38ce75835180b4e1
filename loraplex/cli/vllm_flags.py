"""``loraplex serve``'s and ``loraplex fleet up``'s usage errors name each vLLM flag of their
command line with what to use instead (the table: ``serve/config/vllm.py``). They refuse them as
click refuses any unknown option; a migrating user's ``vllm serve BASE --enable-lora
--lora-modules sql=/p`` was ``No such option: --enable-lora (Possible options: --max-loras)``
alone, one flag per attempt, with nothing that said where adapters, the base model's name or the
API key had gone. ``fleet up`` also names the flags vLLM shares with ``serve`` that it has no
flag for (``--max-cpu-loras``): it takes them as ``--config`` keys.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from typer._click import core as click_core  # typer 0.29 vendors click: its errors
from typer._click import exceptions as click_errors
from typer.core import TyperCommand

from loraplex.serve.config.vllm import MODEL_ARGUMENT, VLLM_ONLY_FLAGS, VLLM_SHARED_FLAGS


def vllm_hints(
    args: Sequence[str], command: str = "loraplex serve", own: Collection[str] = ()
) -> list[str]:
    """One line per vLLM-only flag among ``args`` (``--flag`` or ``--flag=value``), in their
    order, each once; the base model given as vLLM's leading argument; and each flag vLLM
    shares with serve that is not among ``own`` (``command``'s options), as its config key."""
    hints: list[str] = []
    if args and not args[0].startswith("-"):
        hints.append(MODEL_ARGUMENT.format(command=command))
    seen: set[str] = set()
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in seen:
            continue
        if flag in VLLM_ONLY_FLAGS:
            hints.append(f"{flag}: {VLLM_ONLY_FLAGS[flag]}")
        elif flag in VLLM_SHARED_FLAGS and flag not in own:
            key = flag.removeprefix("--").replace("-", "_")
            hints.append(
                f"{flag}: {command} takes it as {key} in the --config file's [serve] table"
            )
        seen.add(flag)
    return hints


def _command_name(ctx: click_core.Context) -> str:
    """``loraplex`` and the (sub)command names below it: ``loraplex fleet up``."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["loraplex", *reversed(names)])


class VllmAwareCommand(TyperCommand):
    """A command whose usage error, when its arguments hold vLLM flags, names each of them
    with what to use instead (``loraplex serve``, ``loraplex fleet up``)."""

    def parse_args(self, ctx: click_core.Context, args: list[str]) -> list[str]:
        given = list(args)  # click consumes the list it parses
        try:
            return super().parse_args(ctx, args)
        except click_errors.UsageError as exc:
            command = _command_name(ctx)
            own = {opt for param in self.params for opt in (*param.opts, *param.secondary_opts)}
            hints = vllm_hints(given, command, own)
            if not hints:
                raise
            lines = "\n".join(f"  {hint}" for hint in hints)
            head = exc.format_message()
            if isinstance(exc, click_errors.NoSuchOption) and exc.option_name in {
                *VLLM_ONLY_FLAGS,
                *VLLM_SHARED_FLAGS,
            }:
                head = exc.message  # click's near names (--enable-lora: --max-loras) mislead
            raise click_errors.UsageError(
                f"{head}\nvLLM's flags that {command} does not take, and "
                f"what to use instead (docs/migrating-from-vllm.md):\n{lines}",
                ctx,
            ) from None
