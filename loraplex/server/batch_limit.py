"""The largest prompt batch one completions request may carry, apart from the request schema
(``server/protocol``, pydantic) so the configuration, which the engine process imports too,
can name it without loading pydantic."""

from __future__ import annotations

MAX_BATCH_PROMPTS = 16  # prompts in one completions request (= choices.DEFAULT_MAX_CHOICES)
