"""What ``loraplex serve`` refuses at once, before a request is queued, applied to a trace record.

The server validates a request before it reaches the engine's queue and answers what it can
never serve with a 400: a prompt of ``max_model_len`` tokens or more (``server/prompts.py``;
``serving.engine_request``'s ``max_prompt_tokens`` is ``max_model_len - 1`` under ``serve``, the
same bound), and a prompt plus its ``max_tokens`` beyond the context (``server/submit.py``;
``bench``'s replay sends each record's ``output_tokens`` as ``max_tokens``). Both rules live in
the ``sampling`` leaf, called here as the server calls them. The rest of the server's checks
before the queue have no trace field to act on: a trace names tokens, not the body's bytes or a
text's characters, one prompt per record, and every adapter it names exists (the simulator has
no registry to miss one); ``output_tokens`` >= 1 is the trace's own rule (``sim/trace.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.errors import ContextLengthError
from loraplex.sampling import check_prompt_room, fit_max_tokens
from loraplex.sim.trace import TraceRecord

# The server's answer to a ``ContextLengthError`` (``server/errors.context_error``; a test
# holds the two the same).
CONTEXT_STATUS = 400
CONTEXT_CODE = "context_length_exceeded"


@dataclass(frozen=True)
class Refusal:
    """The server's answer to a request it refuses before queueing it."""

    status: int  # its HTTP status
    code: str  # its error body's ``code`` (the reason)
    message: str  # its error body's ``message``
    error: str  # the domain error's class name (``Outcome.error``)


def refusal(record: TraceRecord, max_model_len: int) -> Refusal | None:
    """How the server answers ``record`` at once; None: it queues it."""
    try:
        check_prompt_room(record.prompt_tokens, max_model_len)
        fit_max_tokens(record.output_tokens, record.prompt_tokens, max_model_len, "max_tokens")
    except ContextLengthError as exc:
        return Refusal(CONTEXT_STATUS, CONTEXT_CODE, str(exc), type(exc).__name__)
    return None
