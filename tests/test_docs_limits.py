"""The fixed limits docs/operations.md states (not settings: constants, schema caps, fixed configs)
are the code's: each sentence below, with the code's number put in, is in the guide. A limit
changed in the code without its sentence fails here, naming the sentence."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from loraplex.engine.transport.restart import RestartPolicy
from loraplex.model.merge import MAX_DELTA_RATIO
from loraplex.model.tokenizer import GIL_HELD_DECODE_IDS
from loraplex.registry.sql.paging import DEFAULT_PAGE, MAX_CURSOR_CHARS, MAX_PAGE
from loraplex.registry.sql.sqlite import READ_TIMEOUT_S, WRITE_TIMEOUT_S
from loraplex.server.batch_limit import MAX_BATCH_PROMPTS
from loraplex.server.choices import DEFAULT_MAX_CHOICES
from loraplex.server.connections import MAX_WAITING
from loraplex.server.fd_limit import RESERVED_FDS
from loraplex.server.history import HistoryConfig
from loraplex.server.json_route import INLINE_JSON_BYTES, INLINE_JSON_ITEMS
from loraplex.server.protocol import CompletionRequest, fields
from loraplex.server.recent_requests import RecentRequests
from loraplex.server.routes_residency import MAX_RESIDENCY_PAGE
from loraplex.server.serving import MAX_REQUEST_ID_CHARS, MAX_SESSION_ID_CHARS
from loraplex.server.tarpit import HOLD_S, MAX_HELD
from loraplex.server.tenant_jobs import MAX_JOBS_PER_TENANT, MAX_LARGE_BODIES_PER_TENANT
from loraplex.server.upload import MAX_TEXT_PART_BYTES

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
TEXT = " ".join(DOC.read_text(encoding="utf-8").split())  # one space wherever a line wrapped


def _cap(field: str) -> int:
    """A completions field's ``max_length`` in the schema."""
    (cap,) = [m.max_length for m in CompletionRequest.model_fields[field].metadata]
    return int(cap)


RESTART = RestartPolicy()
HISTORY = HistoryConfig()
RECENT = {name: p.default for name, p in inspect.signature(RecentRequests).parameters.items()}
_HOURS = {3600.0: "one hour"}  # the words the guide uses for RecentRequests' ttl_s


SENTENCES = [
    f"each `stop` string at most {fields.MAX_STOP_CHARS} characters",
    f"`user` and a chat message's `name` at most {fields.MAX_NAME_CHARS} characters,",
    f"`messages` {fields.MAX_CHAT_MESSAGES:,} ({fields.MAX_CONTENT_PARTS} text parts each)",
    f"a batch of `prompt`s {MAX_BATCH_PROMPTS} (the fan-out limit)",
    f"a token-id list {fields.MAX_TOKEN_IDS:,}",
    f"`logit_bias` {_cap('logit_bias')} entries, `stop_token_ids` {_cap('stop_token_ids')}, "
    f"`stop` {fields.MAX_STOP_STRINGS}.",
    f"at most {_cap('logit_bias')} entries (vLLM clamps",
    f"ids must be JSON integers in the vocabulary, at most {_cap('stop_token_ids')}",
    f"`top_logprobs` (0–{fields.MAX_TOP_LOGPROBS})",
    f"`logprobs` (integer 0–{fields.MAX_TOP_LOGPROBS})",
    f"at most {DEFAULT_MAX_CHOICES} engine requests per HTTP request",
    f"printable ASCII, at most {MAX_REQUEST_ID_CHARS} characters",
    f"A tenant body over {INLINE_JSON_BYTES >> 10} KiB, or with more than {INLINE_JSON_ITEMS} "
    "commas and opening brackets (counted in C without parsing, inside strings too: "
    "`json_route.INLINE_JSON_ITEMS`, not a setting)",
    f"at most {MAX_LARGE_BODIES_PER_TENANT} of a tenant's bodies so parsed at once is parsed and "
    "validated (`tenant_jobs.MAX_LARGE_BODIES_PER_TENANT`, not a setting; "
    f"each also takes one of its {MAX_JOBS_PER_TENANT} places)",
    f"is more than {MAX_DELTA_RATIO:g} times the largest base weight of that module is never "
    "merged, in any mode (`merge.py: MAX_DELTA_RATIO`, not a setting)",
    f"a decode of at most {GIL_HELD_DECODE_IDS} ids, `GIL_HELD_DECODE_IDS`, keeps the plain call",
    f"`X-Session-Id` (header, printable, at most {MAX_SESSION_ID_CHARS} characters",
    f"`top` 0-{MAX_RESIDENCY_PAGE}, default {MAX_RESIDENCY_PAGE}, above {MAX_RESIDENCY_PAGE} a "
    "400 naming `top`",
    f"each at most {MAX_TEXT_PART_BYTES >> 10} KiB",
    f"`limit` 1-{MAX_PAGE}, default {DEFAULT_PAGE}, `after` 1-{MAX_CURSOR_CHARS} characters",
    f"gets the first {DEFAULT_PAGE}",
    f"a read transaction still running a statement {READ_TIMEOUT_S:g} s after it began has it "
    "interrupted and gets 503 `registry_unavailable` (`sqlite.py: READ_TIMEOUT_S`, not a setting;",
    f"waits for it {WRITE_TIMEOUT_S:g} s at most (`sqlite.py: WRITE_TIMEOUT_S`, not a setting), "
    "then gets 503 `registry_unavailable`",
    f"a backoff: {RESTART.initial_backoff_s:g} s for the first restart, doubling per further "
    f"attempt (a crash soon after coming back, or a failed start) up to {RESTART.max_backoff_s:g} "
    f"s, back to {RESTART.initial_backoff_s:g} s once an engine has stayed up for "
    f"{RESTART.healthy_reset_s:g} s",
    f"remembers the last {RECENT['max_entries']:,} response ids for "
    f"{_HOURS.get(RECENT['ttl_s'], str(RECENT['ttl_s']) + ' s')}, each tenant's last "
    f"{RECENT['max_entries_per_tenant']:,}",
    f"and {HOLD_S:g} s later it is reset; at most {MAX_HELD:,} are held at once",
    f"`max_connections` + {MAX_HELD:,} held + {MAX_WAITING} waiting for room (above) + "
    f"{RESERVED_FDS} reserved",
    f"and at most {MAX_WAITING} in all (`MAX_WAITING`, `server/connections.py`;",
    f"interval {HISTORY.interval_s:g} s, length {HISTORY.length_s:g} s, top "
    f"{HISTORY.top_revisions} revisions, {HISTORY.max_replicas} replicas a sample, "
    f"{HISTORY.max_tracked_revisions} revisions counted by name within one interval",
]


@pytest.mark.parametrize("sentence", SENTENCES)
def test_documented_limit_is_the_code_limit(sentence: str) -> None:
    assert sentence in TEXT, f"operations.md lacks: {sentence!r}"
