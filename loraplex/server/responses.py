"""Non-streaming choices from every sibling's output: ``best_of``'s pick, OpenAI's indices,
``echo`` and logprobs in each endpoint's shape."""

from __future__ import annotations

from collections.abc import Sequence

from loraplex.engine.protocol import TokenLogprob
from loraplex.server.choices import ChoiceOutput, Echo, Shape, best
from loraplex.server.logprobs_format import (
    ChoiceOffsets,
    TokenStrings,
    chat_logprobs,
    completion_logprobs,
)
from loraplex.server.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatLogprobs,
    ChatMessageOut,
    CompletionChoice,
    CompletionLogprobs,
)
from loraplex.server.sampling_fields import output_logprobs


def _entries(out: ChoiceOutput, echo: Echo | None) -> list[TokenLogprob | None]:
    """The output's logprobs (after the prompt's under ``echo``); a RuntimeError when the
    engine sent none although they were asked for (a null would silently drop them)."""
    if out.completion_tokens and not out.has_logprobs:
        raise RuntimeError("the engine returned no logprobs although they were requested")
    if echo is None:
        return list(out.logprobs)
    if out.prompt_logprobs is None:
        raise RuntimeError("the engine returned no prompt logprobs although echo asked")
    return [*out.prompt_logprobs, *out.logprobs]


def completion_choices(
    outputs: Sequence[ChoiceOutput],
    shape: Shape,
    num_top: int | None,
    echo: Sequence[Echo] | None,
    strings: TokenStrings,
) -> list[CompletionChoice]:
    """Per prompt ``p``, its ``n`` choices at indices ``p * n + rank``."""
    choices = []
    for p, group in enumerate(best(outputs, shape)):
        shown = echo[p] if echo is not None else None
        for rank, out in enumerate(group):
            logprobs: CompletionLogprobs | None = None
            if num_top is not None:
                first = shown.first_token_id if shown is not None else None
                entries = _entries(out, shown)
                offsets = ChoiceOffsets(strings, len(shown.text) if shown is not None else None)
                logprobs = completion_logprobs(
                    entries, strings, num_top, offsets,
                    num_prompt=len(entries) - len(out.logprobs), first_token_id=first,
                )  # fmt: skip
            prefix = shown.text if shown is not None else ""
            choices.append(
                CompletionChoice(
                    index=p * shape.n + rank,
                    text=prefix + out.text,
                    logprobs=logprobs,
                    finish_reason=out.finish_reason,
                    stop_reason=out.stop_reason,
                )
            )
    return choices


def chat_choices(
    outputs: Sequence[ChoiceOutput], body: ChatCompletionRequest, strings: TokenStrings
) -> list[ChatChoice]:
    num_top = output_logprobs(body)
    choices = []
    for index, out in enumerate(outputs):
        logprobs: ChatLogprobs | None = None
        if num_top is not None:
            entries = [e for e in _entries(out, None) if e is not None]
            logprobs = ChatLogprobs(content=chat_logprobs(entries, strings, num_top))
        choices.append(
            ChatChoice(
                index=index,
                message=ChatMessageOut(content=out.text),
                logprobs=logprobs,
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
            )
        )
    return choices
