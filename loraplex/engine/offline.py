"""Offline generation through the serving engine, without HTTP: ``loraplex generate`` and
``loraplex demo`` run here.

``OfflineEngine`` is ``EngineCore`` (paged KV cache, scheduler, adapter cache, ``OutputTracker``)
driven by the caller's thread: add the requests, call ``step()`` until each has finished, and
return the outputs in request order. There is no second decoding loop, so stop strings,
``min_tokens``, EOS handling and mixed adapter batches behave exactly as they do when serving.

Adapters are PEFT directories on local disk: each is validated against the base model before
anything loads, then read in place as the cache's artifact store (L3; ``adapter_dir_store.py``).
More distinct adapters than GPU slots are served in turn, as the server does, rather than refused.
"""

from __future__ import annotations

import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loraplex.artifacts.base_model import BaseModelSpec, read_model_config
from loraplex.artifacts.identity import AdapterKey, sha256_file
from loraplex.artifacts.validate import validate_adapter_dir
from loraplex.dtypes import DTYPE_BYTES, bytes_per_element, check_dtype
from loraplex.engine.adapter_dir_store import AdapterDirStore
from loraplex.engine.config import EngineConfig, SchedulerConfig
from loraplex.engine.factory import AdapterRuntimeConfig, build_adapter_runtime, build_engine_core
from loraplex.engine.protocol import EngineRequest, TokenDelta, TokenLogprob
from loraplex.errors import InvalidRequestError, quoted
from loraplex.model.config import check_max_model_len, context_window
from loraplex.runtime.tier_backends import ArtifactRef
from loraplex.sampling import SamplingParams

_TENANT = "local"  # the one tenant of an offline engine
# Offline requests wait in the queue as long as the batch takes: no queue deadline applies.
# NOTE: finite, because the cache arms timers with it (a week is far beyond any batch).
_NO_DEADLINE_S = 7 * 24 * 3600.0
_KV_TOKENS = 16384  # the paged KV budget (serve's default 1024 blocks x 16 tokens)
_IDLE_WAIT_S = 0.05  # how long to sleep when only adapter loads are in progress
_MIN_BATCHED_TOKENS = 512  # the step token budget at least (serve's default)


@dataclass(frozen=True)
class OfflineConfig:
    """The engine an offline run builds: dtype, device, LoRA slots and batch size."""

    dtype: str = "float32"  # model, KV and adapter dtype: float32, bfloat16 or float16
    device: str = "cpu"  # torch device string
    max_loras: int = 8  # GPU adapter slots; more distinct adapters are served in turn
    max_lora_rank: int = 64  # largest adapter rank accepted
    max_num_seqs: int = 64  # sequences decoded together; more requests queue
    # prompt + output tokens, at most the model's context (``model.config.context_window``:
    # max_position_embeddings, or what its rope scaling extends it to); None: that context
    max_model_len: int | None = None
    block_size: int = 16  # tokens per KV block

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        for name in ("max_loras", "max_lora_rank", "max_num_seqs", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len {self.max_model_len} is invalid; expected >= 2")


@dataclass(frozen=True)
class OfflineRequest:
    """One prompt to continue."""

    prompt: str | tuple[int, ...]  # text (the tokenizer adds BOS etc.) or token ids as given
    adapter_dir: Path | None = None  # PEFT adapter directory; None = base model only
    params: SamplingParams = field(default_factory=SamplingParams)  # sampling and stopping


@dataclass(frozen=True)
class OfflineResult:
    """One request's continuation."""

    text: str  # generated text (special tokens skipped, cut before a stop string)
    token_ids: tuple[int, ...]  # every generated token, including an EOS or stop-completing one
    finish_reason: str  # "stop" (EOS, a stop string or token) or "length" (max_tokens, context)
    prompt_tokens: int  # tokens in the encoded prompt
    stop_reason: str | int | None = None  # the stop string or token id that ended it; else None
    logprobs: tuple[TokenLogprob, ...] | None = None  # per generated token, if params asked
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # per prompt token, if asked


class OfflineEngine:
    """A loaded base model, its adapter cache and the serving engine core, driven in-process.

    Reusable across ``generate`` calls: adapters stay cached (GPU slots, then CPU) between them.
    Not thread-safe: one caller drives it. ``close`` (or ``with``) stops the cache's workers and
    removes its temporary L2 directory.
    """

    def __init__(self, model_dir: Path, config: OfflineConfig | None = None) -> None:
        self.config = config or OfflineConfig()
        self.base_spec = BaseModelSpec.from_dir(model_dir)
        self._store = AdapterDirStore()
        self._refs: dict[AdapterKey, ArtifactRef] = {}  # what the cache resolves keys with
        self._disk = tempfile.TemporaryDirectory(prefix="loraplex-offline-")
        self._wake = threading.Event()  # set by the cache when a lease is ready
        self._num_added = 0  # request ids are unique for the engine's life
        runtime_config = AdapterRuntimeConfig(
            max_loras=self.config.max_loras,
            max_lora_rank=self.config.max_lora_rank,
            dtype=self.config.dtype,
            device=self.config.device,
        )
        self.runtime = build_adapter_runtime(
            self.base_spec,
            self._refs.__getitem__,
            self._store,
            Path(self._disk.name),
            runtime_config,
        )
        try:
            engine_config = self._engine_config(model_dir)
            self.core = build_engine_core(model_dir, engine_config, self.runtime)
        except BaseException:
            self.runtime.cache.close()
            self._disk.cleanup()
            raise
        self.core.on_lease_done = self._wake.set
        self.tokenizer = self.core.tokenizer

    def _engine_config(self, model_dir: Path) -> EngineConfig:
        cfg = self.config
        model_config = read_model_config(model_dir)
        max_model_len = cfg.max_model_len or context_window(model_config)[0]
        check_max_model_len(max_model_len, model_config)
        num_blocks = -(-max(_KV_TOKENS, max_model_len) // cfg.block_size)
        scheduler = SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=max(_MIN_BATCHED_TOKENS, cfg.max_num_seqs),
            max_model_len=max_model_len,
            default_deadline_s=_NO_DEADLINE_S,
            class_reserve_seqs=0,  # one tenant: no seats kept for another priority class
        )
        return EngineConfig(
            scheduler=scheduler,
            block_size=cfg.block_size,
            num_kv_blocks=num_blocks,
            dtype=cfg.dtype,
            device=cfg.device,
            idle_wait_s=_IDLE_WAIT_S,
        )

    def generate(
        self,
        requests: Sequence[OfflineRequest],
        between_steps: Callable[[int], None] | None = None,
    ) -> list[OfflineResult]:
        """Continue every request; results are in request order. ``between_steps`` is called
        with the number of steps run so far before each step (mode transitions happen there).

        Every adapter is validated and every prompt encoded before any request starts, so bad
        input fails the call having changed nothing. A request that fails in the engine (its
        adapter does not load, its step raised) fails the call with that error.
        """
        keys = self._adapter_keys([r.adapter_dir for r in requests])
        prepared = [self._engine_request(r, k) for r, k in zip(requests, keys, strict=True)]
        outputs = self._run(prepared, between_steps)
        return [_result(outputs[p.request_id]) for p in prepared]

    def adapter_key(self, adapter_dir: Path) -> AdapterKey:
        """The cache key ``adapter_dir`` is served under (validated and registered)."""
        return self._register(adapter_dir)

    def _adapter_keys(self, adapter_dirs: Sequence[Path | None]) -> list[AdapterKey | None]:
        """Validate each distinct adapter directory and make it resolvable by its key."""
        keys = {d: self._register(d) for d in dict.fromkeys(adapter_dirs) if d is not None}
        return [None if d is None else keys[d] for d in adapter_dirs]

    def _register(self, adapter_dir: Path) -> AdapterKey:
        validated = validate_adapter_dir(adapter_dir, self.base_spec, self.config.max_lora_rank)
        config_file = adapter_dir / "adapter_config.json"
        weights_file = adapter_dir / "adapter_model.safetensors"
        config_digest = sha256_file(config_file)
        # The name and revision only tell adapters apart: same files, same key (cached once).
        key = validated.key(_TENANT, f"w{validated.digest[:32]}", f"c{config_digest[:32]}")
        stored = DTYPE_BYTES[validated.dtype]
        self._refs[key] = ArtifactRef(
            config_digest=config_digest,
            weights_digest=validated.digest,
            disk_bytes=config_file.stat().st_size + weights_file.stat().st_size,
            memory_bytes=validated.estimated_bytes * bytes_per_element(self.config.dtype) // stored,
        )
        self._store.put_file(config_file, config_digest)
        self._store.put_file(weights_file, validated.digest)
        return key

    def _engine_request(self, request: OfflineRequest, key: AdapterKey | None) -> EngineRequest:
        if isinstance(request.prompt, str):
            prompt_ids = tuple(self.tokenizer.encode(request.prompt))
        else:
            prompt_ids = tuple(request.prompt)
        if not prompt_ids:
            raise InvalidRequestError(
                f"prompt {quoted(request.prompt)} encodes to no tokens; expected at least one",
                "prompt",
            )
        self._num_added += 1
        return EngineRequest(f"offline-{self._num_added}", _TENANT, key, prompt_ids, request.params)

    def _run(
        self, requests: list[EngineRequest], between_steps: Callable[[int], None] | None = None
    ) -> dict[str, list[TokenDelta]]:
        """Steps the engine until every request has finished; their deltas by request id."""
        outputs: dict[str, list[TokenDelta]] = {r.request_id: [] for r in requests}
        failures: list[BaseException] = []
        queued = deque(requests)
        live: set[str] = set()

        def sink_for(request_id: str) -> Callable[[TokenDelta | BaseException], None]:
            def sink(item: TokenDelta | BaseException) -> None:
                if isinstance(item, BaseException):
                    failures.append(item)
                    live.discard(request_id)
                    return
                outputs[request_id].append(item)
                if item.finish_reason is not None:
                    live.discard(request_id)

            return sink

        max_live = self.core.scheduler.config.max_queue_len
        num_steps = 0
        try:
            while queued or live:
                while queued and len(live) < max_live:  # the queue's bound is the engine's
                    request = queued.popleft()
                    live.add(request.request_id)
                    self.core.add(request, sink_for(request.request_id))
                if failures:
                    raise failures[0]
                if between_steps is not None:
                    between_steps(num_steps)
                num_steps += 1
                if not self.core.step() and live:
                    self._wake.wait(_IDLE_WAIT_S)  # only adapter loads are in progress
                    self._wake.clear()
            if failures:
                raise failures[0]
        finally:
            for request_id in list(live):
                self.core.abort(request_id)
        return outputs

    def close(self) -> None:
        """Stop the engine and the cache; remove the temporary L2 copies."""
        self.core.close()
        self.runtime.cache.close()
        self._disk.cleanup()

    def __enter__(self) -> OfflineEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _result(deltas: list[TokenDelta]) -> OfflineResult:
    last = deltas[-1]
    assert last.finish_reason is not None  # _run returns only finished requests
    return OfflineResult(
        text="".join(d.text for d in deltas),
        token_ids=tuple(t for d in deltas for t in d.token_ids),
        finish_reason=last.finish_reason,
        prompt_tokens=last.prompt_tokens,
        stop_reason=last.stop_reason,
        logprobs=None if deltas[0].logprobs is None else tuple(_logprobs(deltas)),
        prompt_logprobs=deltas[0].prompt_logprobs,
    )


def _logprobs(deltas: list[TokenDelta]) -> Iterator[TokenLogprob]:
    for delta in deltas:
        yield from delta.logprobs or ()
