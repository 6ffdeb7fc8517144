"""The asyncio side of a request in a server (free of JAX: the HTTP front
end of a multi-process server uses it as the in-process engine does)."""

from __future__ import annotations

import asyncio

from ..outputs import RequestOutput

# Requests allowed to wait (queued, not yet running) before new ones get 503:
# beyond a few full batches a client is better told to retry than to queue.
DEFAULT_MAX_NUM_WAITING = 1024

ACK = object()  # first item of a stream: the engine accepted the request


class RequestStream:
    """The asyncio side of one request: outputs (or an exception) in order."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    async def get(self):
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if isinstance(item, RequestOutput) and item.finished:
            self.finished = True
        return item


def put_all(batch) -> None:
    """Puts each (stream, item) of ``batch`` (on the streams' event loop)."""
    for stream, item in batch:
        stream.queue.put_nowait(item)
