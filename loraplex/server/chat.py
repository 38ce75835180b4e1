"""Chat prompts: the base model's Jinja chat template, rendered the way transformers does.

The template comes from ``tokenizer_config.json`` and runs in Jinja's immutable sandbox (it is
data shipped with a checkpoint, not trusted code).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from loraplex.errors import CheckpointError, InvalidRequestError
from loraplex.model.tokenizer import TextTokenizer

# What one message costs in ``max_prompt_chars`` beyond its role, name and content: the text a
# template writes around it (ChatML ~24 characters, Llama 3 ~48). Without a charge, 500,000
# empty messages counted as 0 characters and took seconds to render and tokenize.
MESSAGE_OVERHEAD_CHARS = 32


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation."""

    role: str  # "system" | "user" | "assistant" | ...
    content: str  # plain text
    name: str | None = None  # a participant's name; the template decides whether to render it


def _special(settings: dict[str, object], name: str) -> str:
    value = settings.get(name)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise_exception(message: str) -> None:
    """What templates call to reject a conversation (as transformers provides)."""
    raise TemplateError(message)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may reference."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(template)
        except TemplateError as exc:
            raise CheckpointError(f"chat_template does not compile: {exc}") from exc
        self.bos_token = bos_token  # text of the BOS token, exposed to the template
        self.eos_token = eos_token  # text of the EOS token, exposed to the template

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> ChatTemplate | None:
        """The checkpoint's template, or None when ``tokenizer_config.json`` has none."""
        path = model_dir / "tokenizer_config.json"
        if not path.is_file():
            return None
        try:
            settings = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
        template = settings.get("chat_template") if isinstance(settings, dict) else None
        if not isinstance(template, str):
            return None
        return cls(template, _special(settings, "bos_token"), _special(settings, "eos_token"))

    def render(self, messages: Sequence[ChatMessage], reasoning_effort: str | None = None) -> str:
        """The prompt text, ending with the assistant's turn opened; ``InvalidRequestError`` when
        the template refuses the conversation (or breaks its sandbox's rules).

        ``reasoning_effort`` reaches the template as vLLM hands it over: as ``reasoning_effort``,
        with ``enable_thinking`` false for ``"none"`` and true otherwise (templates of
        reasoning models read them; others ignore them).
        """
        payload = [_payload(m) for m in messages]
        effort = {}
        if reasoning_effort is not None:
            effort = {
                "reasoning_effort": reasoning_effort,
                "enable_thinking": reasoning_effort != "none",
            }
        try:
            return self._template.render(
                messages=payload,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **effort,
            )
        except TemplateError as exc:
            raise InvalidRequestError(
                f"messages cannot be rendered by the chat template: {exc}", "messages"
            ) from exc

    def encode(
        self,
        messages: Sequence[ChatMessage],
        tokenizer: TextTokenizer,
        reasoning_effort: str | None = None,
    ) -> list[int]:
        """Token ids of the rendered prompt.

        NOTE: ``TextTokenizer.encode`` adds the post-processor's special tokens (BOS) and most
        templates write ``{{ bos_token }}`` too; a doubled prefix is cut back to one copy.
        """
        ids = tokenizer.encode(self.render(messages, reasoning_effort))
        added = tokenizer.encode("")
        if added and ids[: 2 * len(added)] == added + added:
            return ids[len(added) :]
        return ids


def num_prompt_chars(messages: Sequence[ChatMessage]) -> int:
    """The characters a conversation is charged before rendering (``MESSAGE_OVERHEAD_CHARS``)."""
    return sum(
        len(m.role) + len(m.name or "") + len(m.content) + MESSAGE_OVERHEAD_CHARS for m in messages
    )


def _payload(message: ChatMessage) -> dict[str, str]:
    """The message as transformers hands it to a template: ``name`` only when given."""
    payload = {"role": message.role, "content": message.content}
    if message.name is not None:
        payload["name"] = message.name
    return payload
