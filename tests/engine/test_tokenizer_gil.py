"""A long text is tokenized, and a long id list decoded, without holding the GIL
(``model/tokenizer.py``): ``tokenizers``' ``encode`` held it throughout, so the server's
tokenizing of one tenant's 32,768-emoji prompt on the thread pool stopped the event loop and
every other thread for 274 ms (``docs/benchmarks/attack15.md``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loraplex.model.tokenizer import GIL_HELD_DECODE_IDS, TextTokenizer

MODEL = Path(".loraplex-assets/test-small/models/loraplex-demo-small")
EMOJI = "\U0001f600" * 32_768  # max_prompt_chars at the demo's max_model_len: 131,073 tokens


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    if not MODEL.is_dir():
        pytest.skip(f"{MODEL} not present")
    return TextTokenizer(MODEL)


def _wakes_during(job: Callable[[], Any]) -> tuple[int, Any]:
    """How often this thread woke from 1 ms sleeps while ``job`` ran on another thread, and
    what it returned: a job that holds the GIL lets it wake at most once or twice."""
    started, done, out = threading.Event(), threading.Event(), []

    def run() -> None:
        started.set()
        out.append(job())
        done.set()

    worker = threading.Thread(target=run)
    worker.start()
    started.wait()
    wakes = 0
    while not done.is_set():
        time.sleep(0.001)
        wakes += 1
    worker.join()
    return wakes, out[0]


def test_a_long_text_is_encoded_without_the_gil(tok: TextTokenizer) -> None:
    # three encodes: one alone woke the sleeper 9 times once (a 2-core Zen 4, tests at idle
    # priority on a loaded machine), one short of the bound (with the GIL held: 0-1 per encode)
    wakes, ids = _wakes_during(lambda: [tok.encode(EMOJI) for _ in range(3)])
    assert all(len(i) == 131_073 for i in ids) and ids[0] == tok._tokenizer.encode(EMOJI).ids
    assert wakes >= 10, wakes  # 0-3 with ``Tokenizer.encode``


def test_a_long_id_list_is_decoded_without_the_gil(tok: TextTokenizer) -> None:
    ids = tok.encode(EMOJI) * 4
    wakes, text = _wakes_during(lambda: tok.decode(ids))
    assert text == EMOJI * 4
    assert wakes >= 5, wakes  # 0-1 with ``Tokenizer.decode``


def test_a_short_id_list_is_decoded_as_before(tok: TextTokenizer) -> None:
    ids = tok.encode("The acme support team")
    assert len(ids) <= GIL_HELD_DECODE_IDS
    assert tok.decode(ids) == tok._tokenizer.decode(ids, skip_special_tokens=True)
    assert tok.token_text(ids[0]) == tok._tokenizer.decode(ids[:1], skip_special_tokens=False)
