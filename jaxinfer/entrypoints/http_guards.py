"""Refusals that must not wait for the body: an ASGI middleware shared by the
OpenAI server and `/generate`.

- A body over the limit gets 413 before it is read when Content-Length says
  so, or as soon as the running count passes the limit (chunked uploads), so
  a 10 MB prompt is never parsed, tokenized or held in memory whole. The
  413 carries ``Connection: close``: the server then closes the connection
  instead of reading the rest of the body to keep it alive, which costs
  about as much CPU as the upload itself and would slow every stream the
  process serves. Clients read the answer after their send fails (urllib3,
  httpcore and curl all do).
- While the waiting queue is full or the server is shutting down, generation
  routes get 503 with Retry-After at once, before any parsing or tokenizing,
  so a client backs off instead of waiting behind the queue for its refusal.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp

# The default request-body limit: far above any prompt that fits a context
# window as text or token ids, far below what would stall the server.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

Respond = Callable[[str, int], ASGIApp]  # (message, status) -> an ASGI response


class RequestGuard:
    def __init__(self, app, *, engine, respond: Respond, max_body_bytes: int,
                 generation_paths: frozenset[str]):
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.engine = engine
        self.respond = respond
        self.max_body_bytes = max_body_bytes
        self.generation_paths = generation_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal is None and _content_length(scope) is None and scope["method"] in (
                "POST", "PUT", "PATCH"):
            receive, refusal = await self._buffer_body(receive)
        if refusal is not None:
            if refusal[1] == 413:  # the rest of the body stays unread
                send = _closing(send)
            return await self.respond(*refusal)(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, scope) -> tuple[str, int] | None:
        try:
            length = _content_length(scope)
        except ValueError:
            return "the Content-Length header is not a number", 400
        if length is not None and length > self.max_body_bytes:
            return self._too_large(length)
        if scope["method"] == "POST" and scope["path"] in self.generation_paths:
            engine = self.engine
            if not engine.accepting:
                return ("the server is shutting down and takes no new "
                        "requests", 503)
            if engine.dead_error is None and engine.queue_full():
                return (f"the server queue is full ({engine.max_num_waiting} "
                        "requests waiting, the --max-num-waiting limit); "
                        "retry later", 503)
        return None

    def _too_large(self, size: int | None) -> tuple[str, int]:
        got = f"{size} bytes" if size is not None else "more"
        return (f"the request body ({got}) is over the server's limit of "
                f"{self.max_body_bytes} bytes (--max-request-body-bytes); "
                "send a shorter prompt", 413)

    async def _buffer_body(self, receive):
        """Reads a body of unknown length up to the limit; returns a receive
        that replays it, or a refusal."""
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _replay([message], receive), None  # client gone
            total += len(message.get("body", b""))
            if total > self.max_body_bytes:
                return receive, self._too_large(None)
            chunks.append(message)
            if not message.get("more_body", False):
                return _replay(chunks, receive), None


def _closing(send):
    """``send`` with ``Connection: close`` added to the response head."""
    async def closing(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [
                *message.get("headers", ()), (b"connection", b"close")]}
        await send(message)
    return closing


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            length = int(value)
            if length < 0:
                raise ValueError(value)
            return length
    return None


def _replay(messages, receive):
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()
    return replayed
