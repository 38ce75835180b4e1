"""A tiny template grammar of readable English, the only text the demo models ever see.

The grammar is small on purpose: a few-million-parameter model trained for a minute learns it
well enough that greedy decoding continues a prompt with grammatical sentences, not noise.
Everything is drawn from a seeded ``random.Random``, so a seed fixes the corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_ADJECTIVES = (
    "red",
    "small",
    "quiet",
    "bright",
    "old",
    "young",
    "green",
    "happy",
    "busy",
    "clever",
    "tall",
    "warm",
    "cold",
    "gentle",
    "brave",
    "lazy",
    "blue",
    "round",
    "soft",
    "early",
)
_NOUNS = (
    "cat",
    "dog",
    "bird",
    "river",
    "garden",
    "teacher",
    "farmer",
    "child",
    "baker",
    "house",
    "tree",
    "letter",
    "train",
    "window",
    "market",
    "doctor",
    "boat",
    "lamp",
    "horse",
    "friend",
)
_VERBS = (
    "sees",
    "likes",
    "finds",
    "follows",
    "paints",
    "visits",
    "watches",
    "helps",
    "carries",
    "opens",
)
_PLACES = (
    "the park",
    "the city",
    "the hill",
    "the shop",
    "the school",
    "the forest",
    "the lake",
    "the station",
    "the village",
    "the kitchen",
)
_TIMES = ("in the morning", "at night", "after lunch", "every day", "on sunday", "before dinner")
_ADVERBS = ("slowly", "quickly", "often", "quietly", "together", "again")

_GLUE = "the a my walks to is and team revision where what like in"
# Every lower-cased word the grammar can produce, apart from adapter names and revision labels.
WORDS = frozenset(
    " ".join((*_ADJECTIVES, *_NOUNS, *_VERBS, *_PLACES, *_TIMES, *_ADVERBS, _GLUE)).split()
)

# Special tokens, in id order (the tokenizer trainer assigns ids 0..n-1 in this order).
PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)


@dataclass(frozen=True)
class ChatTurn:
    """One user question and the assistant answer the base model learns to give."""

    question: str  # user message text
    answer: str  # assistant message text


def _noun_phrase(rng: random.Random) -> str:
    article = rng.choice(("the", "a", "the", "my"))
    if rng.random() < 0.5:
        return f"{article} {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    return f"{article} {rng.choice(_NOUNS)}"


def sentence(rng: random.Random) -> str:
    """One grammatical sentence, capitalised and ending with a full stop."""
    form = rng.randrange(4)
    subject = _noun_phrase(rng)
    if form == 0:
        text = f"{subject} {rng.choice(_VERBS)} {_noun_phrase(rng)}"
    elif form == 1:
        text = f"{subject} {rng.choice(_VERBS)} {_noun_phrase(rng)} {rng.choice(_TIMES)}"
    elif form == 2:
        text = f"{subject} walks {rng.choice(_ADVERBS)} to {rng.choice(_PLACES)}"
    else:
        text = f"{subject} is {rng.choice(_ADJECTIVES)} and {rng.choice(_ADJECTIVES)}"
    return text[0].upper() + text[1:] + "."


def team_sentence(rng: random.Random, tenant: str, name: str) -> str:
    """A sentence about an adapter's team, so tenant and adapter names are known tokens."""
    return f"The {tenant} {name} team {rng.choice(_VERBS)} {_noun_phrase(rng)}."


def revision_sentence(rng: random.Random, revision: str) -> str:
    """A sentence naming a revision label, so labels such as ``r2`` are known tokens."""
    return f"Revision {revision} is {rng.choice(_ADJECTIVES)} and {rng.choice(_ADJECTIVES)}."


def adjective(rng: random.Random) -> str:
    """One adjective of the grammar."""
    return rng.choice(_ADJECTIVES)


def document(rng: random.Random, num_sentences: int) -> str:
    """A short paragraph of ``num_sentences`` sentences separated by single spaces."""
    return " ".join(sentence(rng) for _ in range(num_sentences))


def chat_turn(rng: random.Random) -> ChatTurn:
    """A question about a noun and a one-sentence answer, for the chat template."""
    noun = rng.choice(_NOUNS)
    place = rng.choice(_PLACES)
    if rng.random() < 0.5:
        return ChatTurn(f"Where is the {noun}?", f"The {noun} is in {place}.")
    adjective = rng.choice(_ADJECTIVES)
    return ChatTurn(f"What is the {noun} like?", f"The {noun} is {adjective}.")
