"""vLLM's ``vllm serve`` flags that ``loraplex serve`` does not take, each with what to use
instead (docs/migrating-from-vllm.md). ``loraplex serve`` refuses them as click refuses any
unknown option, and this adds the way out: a migrating user's ``vllm serve BASE --enable-lora
--lora-modules sql=/p`` was ``No such option: --enable-lora`` alone, one flag per attempt, with
nothing that said where adapters, the base model's name or the API key had gone.

The flags vLLM and loraplex share (``--max-loras``, ``--max-lora-rank``, ``--max-cpu-loras``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--max-model-len``, ``--dtype``, ``--host``,
``--port``) are ``loraplex serve``'s own and never reach this table.
"""

from __future__ import annotations

from collections.abc import Sequence

from typer._click import core as click_core  # typer 0.29 vendors click: its errors
from typer._click import exceptions as click_errors
from typer.core import TyperCommand

_REGISTER = (
    "adapters are registered, not given as flags: `loraplex tenants create T`, then per adapter "
    "`loraplex adapters register PATH --tenant T --name NAME --revision R --base-model BASE` "
    "(or POST /v1/load_lora_adapter with lora_name T/NAME, which needs --import-dir); a key of "
    "T (`loraplex keys create T`) then calls it as model NAME"
)
_TP = "one engine per device: scale out with `loraplex fleet up --replicas N`"

# vLLM flag -> what loraplex takes instead (each checked against loraplex's code)
VLLM_ONLY_FLAGS: dict[str, str] = {
    "--enable-lora": "loraplex always serves LoRA adapters: leave it out",
    "--lora-modules": _REGISTER,
    "--served-model-name": "the base model's name is the name of its directory (--model DIR)",
    "--api-key": (
        "clients send a tenant's key (`loraplex keys create TENANT`); the admin credential is "
        "--admin-key"
    ),
    "--disable-uvicorn-access-log": "use --no-access-log",
    "--uvicorn-log-level": "use --log-level",
    "--lora-dtype": "adapters are held in the model's --dtype",
    "--tensor-parallel-size": _TP,
    "-tp": _TP,
    "--gpu-memory-utilization": (
        "the KV cache is sized in blocks: num_kv_blocks and block_size in the --config file"
    ),
    "--block-size": "block_size in the --config file",
}
MODEL_ARGUMENT = (
    "MODEL: `vllm serve MODEL` takes the base model as an argument; loraplex serve takes it "
    "as --model DIR"
)


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
