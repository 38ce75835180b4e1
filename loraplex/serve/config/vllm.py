"""vLLM's ``vllm serve`` flags that ``loraplex serve`` does not take, each with what to use
instead (docs/migrating-from-vllm.md): the command lines of ``serve`` and ``fleet up`` list them
in their usage errors (``cli/vllm_flags.py``), the ``--config`` file in its refusal of an unknown
key (``file.py``). The flags vLLM and loraplex share (``VLLM_SHARED_FLAGS``) are ``loraplex
serve``'s own and never in this table. Each text holds for both commands: a flag that only
``serve`` has is named as serve's, beside its ``--config`` key."""

from __future__ import annotations

from collections.abc import Iterable

_REGISTER = (
    "adapters are registered, not given as flags: `loraplex tenants create T`, then per adapter "
    "`loraplex adapters register PATH --tenant T --name NAME --revision R --base-model BASE` "
    "(or POST /v1/load_lora_adapter with lora_name T/NAME, which needs import_dir: serve's "
    "--import-dir, or the --config file's key); a key of T (`loraplex keys create T`) then calls "
    "it as model NAME"
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
    "--disable-uvicorn-access-log": (
        "use serve's --no-access-log, or access_log = false in the --config file"
    ),
    "--uvicorn-log-level": "use --log-level",
    "--lora-dtype": (
        "adapters are held in the model's dtype: serve's --dtype, or dtype in the --config file"
    ),
    "--tensor-parallel-size": _TP,
    "-tp": _TP,
    "--gpu-memory-utilization": (
        "the KV cache is sized in blocks: num_kv_blocks and block_size in the --config file"
    ),
    "--block-size": "block_size in the --config file",
}
# the flags vLLM and ``loraplex serve`` share; ``fleet up`` takes those it has no flag for as
# their ``--config`` keys (the flag's name, underscored)
VLLM_SHARED_FLAGS = (
    "--max-loras",
    "--max-lora-rank",
    "--max-cpu-loras",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--max-model-len",
    "--dtype",
    "--host",
    "--port",
)
# ``{command}``: the loraplex command refusing it (``loraplex serve``, ``loraplex fleet up``)
MODEL_ARGUMENT = (
    "MODEL: `vllm serve MODEL` takes the base model as an argument; {command} takes it "
    "as --model DIR"
)


def vllm_file_keys(unknown: Iterable[str]) -> list[str]:
    """The unknown config-file keys that are vLLM flags written as keys (``enable_lora``)."""
    return [key for key in unknown if "--" + key.replace("_", "-") in VLLM_ONLY_FLAGS]
