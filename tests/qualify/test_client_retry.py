"""The qualification client against a raw socket server: a 429/503 with Retry-After is sent
again after its wait, at most ``max_retries`` times and counted; a refusal without Retry-After
is not retried."""

from __future__ import annotations

import asyncio

from loraplex.qualify.client import Answer, stream_completion

BUSY = b'{"error": {"type": "engine_unavailable"}}'
STREAM = (
    b'data: {"choices": [{"text": "hi"}], "loraplex": {"revision": "t/a@r1", "tier": "L0"}}\n\n'
    b"data: [DONE]\n\n"
)


def _refusal(status: bytes, retry_after: bytes | None) -> bytes:
    header = b"" if retry_after is None else b"Retry-After: " + retry_after + b"\r\n"
    return b"HTTP/1.1 %s Busy\r\n%sContent-Length: %d\r\n\r\n%s" % (
        status, header, len(BUSY), BUSY
    )  # fmt: skip


OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(STREAM), STREAM)


def _complete(replies: list[bytes], max_retries: int) -> tuple[Answer, int]:
    """Serves ``replies`` in order, one per connection; returns the answer and requests seen."""

    async def main() -> tuple[Answer, int]:
        seen = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            seen.append(1)
            writer.write(replies[min(len(seen), len(replies)) - 1])
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            body = {"model": "t/a", "prompt": "x", "max_tokens": 1}
            answer = await stream_completion(url, "k", body, 10.0, max_retries=max_retries)
        return answer, len(seen)

    return asyncio.run(main())


def test_a_refusal_with_retry_after_is_retried_and_counted() -> None:
    answer, requests = _complete([_refusal(b"503", b"0"), _refusal(b"429", b"0"), OK], 2)
    assert requests == 3 and answer.retried == [503, 429]
    assert answer.answered and answer.text == "hi" and answer.revision == "t/a@r1"
    assert answer.ttft_s is not None


def test_retries_stop_at_the_bound() -> None:
    answer, requests = _complete([_refusal(b"503", b"0")], 1)
    assert requests == 2 and answer.retried == [503]
    assert answer.status == 503 and not answer.answered and answer.retry_after_s == 0.0


def test_a_refusal_without_retry_after_is_final() -> None:
    answer, requests = _complete([_refusal(b"503", None), OK], 2)
    assert requests == 1 and answer.retried == [] and answer.status == 503
