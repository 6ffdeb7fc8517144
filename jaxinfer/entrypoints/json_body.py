"""The one reader of JSON request bodies, for every route of both servers.

FastAPI parses a route's body with ``await request.json()``; `JSONBodyRoute`
hands every route a request whose ``json()`` is `parse_json_body`, and
``/invocations`` (which picks its model from the body) calls it directly.
So every route answers the same 400 for the same body:

- size: over ``--max-request-body-bytes`` is refused before the body is
  read (``http_guards.RequestGuard``, 413);
- encoding: the body must be UTF-8 (``json.loads`` would otherwise guess
  UTF-16 or UTF-32 from the first bytes);
- depth: at most ``MAX_JSON_DEPTH`` nested arrays / objects. Python's
  parser recurses and would raise ``RecursionError`` on a body nested a few
  thousand deep; a body nested less deep still reaches code that walks it
  recursively (validation, chat templates, ``json.dumps``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute

# serde_json's default recursion limit; far deeper than any request of the
# OpenAI API (a chat message's content parts are four levels down).
MAX_JSON_DEPTH = 128


def parse_json_body(data: bytes) -> Any:
    """The parsed body; a 400 ``HTTPException`` saying what is wrong.
    Malformed JSON raises ``json.JSONDecodeError`` (FastAPI reports its
    position)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPException(400, f"the request body must be UTF-8 encoded "
                            f"JSON (byte {e.start} is not UTF-8)") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep() from None
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise _too_deep()
    return value


def _too_deep() -> HTTPException:
    return HTTPException(400, f"the request body is nested more than "
                         f"{MAX_JSON_DEPTH} arrays / objects deep; flatten it")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays / objects nest more than ``limit`` deep (a walk with
    a stack of its own: no recursion)."""
    if not isinstance(value, (dict, list)):
        return False
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children
                     if isinstance(c, (dict, list)))
    return False


class JSONBodyRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json


class JSONBodyRoute(APIRoute):
    """A route whose body is read by `parse_json_body`: set
    ``app.router.route_class = JSONBodyRoute`` before adding routes."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def read_with_limits(request: Request):
            return await handler(JSONBodyRequest(request.scope, request.receive))
        return read_with_limits
