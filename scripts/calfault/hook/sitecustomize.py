"""Diagnostic hook for scripts/calfault/streams.py (issue 30): with ``CALFAULT_SERVER_LOG`` set,
a server process records when each SSE event was produced (``_Buffer.put``) and when the
writer took events for its socket (``_Buffer.take``), with the completion id the event
carries and the events taken at once, one JSON line each, on the system-wide monotonic clock
the client stamps its arrivals on."""

import os

_path = os.environ.get("CALFAULT_SERVER_LOG")
if _path:
    import json
    import re
    import time

    _ID = re.compile(r'"id":"([^"]+)"')
    _file = open(_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (process-long)

    def _note(kind, text, parts):
        found = _ID.search(text)
        record = {"k": kind, "t": time.monotonic(), "id": found and found.group(1), "n": parts}
        _file.write(json.dumps(record) + "\n")

    from loraplex.server import stream_buffer

    _put, _take = stream_buffer._Buffer.put, stream_buffer._Buffer.take

    def put(self, text):
        _note("put", text, 1)
        return _put(self, text)

    async def take(self):
        text = await _take(self)
        if text is not None:
            _note("take", text, text.count("data: "))
        return text

    stream_buffer._Buffer.put, stream_buffer._Buffer.take = put, take
