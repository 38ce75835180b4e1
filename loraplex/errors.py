"""Domain exceptions.

Every error loraplex raises on bad input is one of these, so callers (the CLI, the HTTP error
mapping in ``server/errors.py``) can act on the type, never on message text. Messages name the
field, the value that was seen and what was expected.
"""

from __future__ import annotations

import difflib
import itertools
import reprlib
from collections.abc import Iterable

# The longest prefix of a caller's value an error message repeats: a 900 KB name must not come
# back whole in an error body (or a log line).
MAX_QUOTED_CHARS = 64


def clipped(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` cut to ``limit`` characters, marked with '…' when cut."""
    return text if len(text) <= limit else text[:limit] + "…"


class _ShortRepr(reprlib.Repr):
    """``repr`` of a container cut to its first items (``[{}, {}, ...]``) before it is built: a
    tenant's 3 MiB list of 700,000 objects took 57 ms of the event loop to become the 2 MB string
    of which a message showed 64 characters. NOTE: ``reprlib`` sorts a dict's keys, all of them,
    before it takes the first few; here they keep their order, as ``repr``'s."""

    def repr_dict(self, x: dict[object, object], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [
            f"{self.repr1(key, level - 1)}: {self.repr1(x[key], level - 1)}"
            for key in itertools.islice(x, self.maxdict)
        ]
        return "{" + ", ".join(pieces) + (", ...}" if len(x) > self.maxdict else "}")


_SHORT_REPR = _ShortRepr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxlist = _SHORT_REPR.maxtuple = _SHORT_REPR.maxdict = 8
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = MAX_QUOTED_CHARS


def quoted(value: object) -> str:
    """``value`` as an error message quotes it: ``repr`` of at most MAX_QUOTED_CHARS characters,
    a container's built from its first items only."""
    if isinstance(value, str) and len(value) > MAX_QUOTED_CHARS:
        return repr(value[:MAX_QUOTED_CHARS]) + "…"
    if isinstance(value, (list, tuple, dict)):
        return clipped(_SHORT_REPR.repr(value))
    return clipped(repr(value))


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest ``word`` (difflib's similarity ratio 0.6 or more), for a message's
    "did you mean"; None: none is that near."""
    near = difflib.get_close_matches(word, list(choices), n=1)
    return near[0] if near else None


def did_you_mean(unknown: Iterable[str], choices: Iterable[str]) -> str:
    """`` (k: did you mean m?)`` for each unknown key with a near choice, for a refusal."""
    known = list(choices)
    near = {k: nearest(k, known) for k in unknown}
    return "".join(f" ({k}: did you mean {m}?)" for k, m in near.items() if m)


class LoraplexError(Exception):
    """Base of every loraplex domain error."""


# --- adapter artifacts: format, identity and compatibility ------------------------------------


class AdapterError(LoraplexError):
    """An adapter artifact cannot be used as given."""


class AdapterConfigError(AdapterError):
    """``adapter_config.json`` is missing, malformed or has an invalid field value."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(
            f"adapter_config.json: field {quoted(field)} is {quoted(value)}; expected {expected}"
        )


class NotAnAdapterDirError(AdapterConfigError):
    """The path given for an adapter is no directory: it names the path, not a config field
    (it read "adapter_config.json: field 'path' is ...", a field no such file has)."""

    def __init__(self, path: str) -> None:
        AdapterError.__init__(self, f"{path}: no such directory; expected an adapter directory")
        self.field, self.value, self.expected = "path", path, "an adapter directory"


class UnsupportedAdapterError(AdapterConfigError):
    """A valid PEFT feature that loraplex does not implement (DoRA, bias, modules_to_save, ...)."""


class RankTooLargeError(AdapterConfigError):
    """An adapter's rank exceeds the configured ``max_lora_rank``."""


class BaseModelMismatchError(AdapterError):
    """The adapter was made for a different base model than the one served."""


class UnsafeFormatError(AdapterError):
    """A file format that can execute code (pickle, ``.bin``/``.pt``) was offered; never opened."""


class CorruptArtifactError(AdapterError):
    """A file is truncated, malformed, or its header contradicts its contents."""


class TensorValidationError(AdapterError):
    """A tensor's name, shape, dtype or values do not fit the base model and the config."""


class DigestMismatchError(AdapterError):
    """Bytes read do not hash to the digest they were registered or addressed under."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(f"{what}: sha256 is {actual}, expected {expected}")


class SignatureError(AdapterError):
    """A signature bundle fails the tenant's trust policy or does not cover the stored bytes.

    ``reason`` says which check failed (tests and the audit log read it, never the message).
    """

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


# --- storage and resolution -------------------------------------------------------------------


class PathOutsideStoreError(LoraplexError):
    """A path resolves outside the directory it must stay within."""


class UnsafeImportError(PathOutsideStoreError):
    """An imported folder holds a link or a non-regular file: a way to read outside it."""


class ArtifactNotFoundError(LoraplexError):
    """The artifact store holds no object for a digest."""


class AdapterNotFoundError(LoraplexError):
    """No adapter the caller may use has this name.

    NOTE: raised identically for a nonexistent adapter and for another tenant's private one,
    so its message must never depend on which case it was.
    """


class RegistryError(LoraplexError):
    """The control-plane store refused an operation (conflict, unknown tenant, ...)."""


class RecordNotFoundError(RegistryError):
    """A tenant or API key an operator named does not exist (the admin API's 404)."""


class RevisionConflictError(RegistryError):
    """An immutable revision was re-registered with different content."""


class MergedRevisionError(RegistryError):
    """An operator asked to deprecate a revision, or move an alias off it, while it is merged
    into the engine's base weights (docs/modes.md): it must be unmerged first (409)."""

    def __init__(self, revision: str, action: str) -> None:
        self.revision = revision  # tenant/name@revision in the base weights
        super().__init__(
            f"revision {revision} cannot be {action}: it is merged into the engine's base "
            "weights; unmerge it first (mode 'auto' unmerges once its traffic leaves; "
            "'merged:<ref>' needs the server's mode changed)"
        )


# --- requests -----------------------------------------------------------------------------------


class InvalidRequestError(LoraplexError):
    """A request field has a value that cannot be served, found where the request is checked
    (400 naming the field). Raised instead of ``ValueError`` so that a ``ValueError`` from
    deeper down stays what it is: a bug, answered with a 500 that reveals nothing."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param  # the request field at fault; None when it is not one field
        super().__init__(message)


# --- capacity -----------------------------------------------------------------------------------


class CapacityError(LoraplexError):
    """Transient: a budget (slots, bytes, queue, quota) cannot take the request now; the same
    request may succeed later (429/503 with Retry-After)."""


class UnservableError(LoraplexError):
    """Permanent: this server, as configured, can never serve the request; retrying cannot help
    (400/422, never Retry-After)."""


class PromptTooLongError(UnservableError):
    """The prompt (plus the tokens it asks for) exceeds the model's context length."""


class ContextLengthError(PromptTooLongError):
    """A request that leaves no room in the model's context, refused before it is queued (400
    ``context_length_exceeded`` naming ``param``): the rules of ``sampling.check_prompt_room``
    and ``sampling.fit_max_tokens``, which the server and the simulator both apply."""

    def __init__(self, message: str, param: str) -> None:
        self.param = param  # the request field to reduce: "prompt", or the output budget's
        super().__init__(message)


class AdapterTooLargeError(UnservableError):
    """The adapter does not fit in a tier's whole budget, so no eviction can make room."""


class TenantCapTooSmallError(AdapterTooLargeError):
    """The adapter fits the tier, but not the tenant's own byte cap there (``max_gpu_bytes``
    ...): the operator's cap refuses it, not the adapter, and no eviction can make room."""


class NoAdapterCacheError(UnservableError):
    """A base-only engine (no adapter cache) was asked for an adapter."""


# --- base model checkpoints ---------------------------------------------------------------------


class CheckpointError(LoraplexError):
    """A base-model checkpoint cannot be loaded as configured: an unsupported config value, or
    missing, unexpected or mis-shaped tensors (loading is strict, never partial)."""


# --- adapter cache ------------------------------------------------------------------------------


class LoadCancelledError(LoraplexError):
    """An adapter load was cancelled (every waiter gave up); its partial effects were undone."""


class CacheIntegrityError(LoraplexError):
    """The adapter cache's bookkeeping broke an invariant (a bug, never bad input)."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        self.detail = detail
        super().__init__(f"cache invariant {invariant!r} broken: {detail}")


# --- access -------------------------------------------------------------------------------------


class AuthenticationError(LoraplexError):
    """An API key is missing, malformed, unknown or revoked (one message for every case)."""


# --- serving engine -------------------------------------------------------------------------------


class QueueTimeoutError(CapacityError):
    """A request stayed queued past its deadline (maps to 503 with Retry-After)."""

    def __init__(self, request_id: str, waited_s: float, retry_after_s: float) -> None:
        self.request_id = request_id
        self.waited_s = waited_s
        # Seconds the client should wait before retrying (the Retry-After header).
        self.retry_after_s = retry_after_s
        super().__init__(
            f"request {request_id!r} waited {waited_s:.2f}s in the queue; past its deadline"
        )


class QueueFullError(CapacityError):
    """The engine's queue (or the tenant's share of it) is full (maps to 429 with Retry-After)."""

    def __init__(self, what: str, limit: int, retry_after_s: float) -> None:
        self.what = what
        self.limit = limit
        # Seconds the client should wait before retrying (the Retry-After header).
        self.retry_after_s = retry_after_s
        super().__init__(f"{what} is full ({limit} queued requests); retry later")


class EngineUnavailableError(CapacityError):
    """The engine process is not running (it failed to start, crashed or was shut down)."""


class RegistryUnavailableError(CapacityError):
    """The registry database could not be reached or did not answer within its limits (a
    connect, statement or lock timeout, a lost connection): only this call failed, its
    transaction rolled back (503 with Retry-After). ``reason`` is one of a few fixed phrases,
    never the server's text or address (a tenant's request may be the one that failed)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the registry database is unavailable: {reason}; retry later")


class GenerationError(LoraplexError):
    """One request could not go on generating (its adapter produced non-finite logits, or its
    part of a step raised); only that request fails, with this error (maps to 422).
    ``model_fault`` False: the request's own sampling values broke its row (the model's logits
    were finite), so it does not count against a revision under release."""

    def __init__(self, request_id: str, reason: str, *, model_fault: bool = True) -> None:
        self.request_id = request_id
        self.reason = reason
        self.model_fault = model_fault
        super().__init__(f"request {request_id!r} failed during generation: {reason}")


class RateLimitError(CapacityError):
    """A tenant sent requests faster than its ``max_requests_per_s`` quota (maps to 429 with
    Retry-After)."""

    def __init__(self, tenant: str, rate_per_s: float, retry_after_s: float) -> None:
        self.tenant = tenant
        self.rate_per_s = rate_per_s
        # Seconds until the tenant's bucket holds a token again (the Retry-After header).
        self.retry_after_s = retry_after_s
        super().__init__(
            f"tenant {tenant!r} is over its rate limit of {rate_per_s:g} requests/s; retry later"
        )
