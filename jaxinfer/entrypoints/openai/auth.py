"""The API key (``--api-key``): an ASGI middleware in front of every route.

Every path needs ``Authorization: Bearer KEY`` except those an operator's
probes read without credentials: ``/health``, and ``/metrics`` unless
``--api-key-protect-metrics``. The rule is "closed unless listed", so a
route added later (or a path that does not exist) is behind the key too:
an unauthenticated client learns nothing about what the server serves,
not even its route list or version. vLLM guards only ``/v1``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp

Respond = Callable[..., ASGIApp]  # (message, status, headers=) -> ASGI response

# Open to probes with or without a key.
HEALTH_PATHS = frozenset({"/health"})
METRICS_PATH = "/metrics"


def open_paths(protect_metrics: bool) -> frozenset[str]:
    """The paths that need no key."""
    return HEALTH_PATHS if protect_metrics else HEALTH_PATHS | {METRICS_PATH}


class APIKeyGuard:
    """Answers 401 (with ``WWW-Authenticate: Bearer``) before the request
    reaches any other middleware or route, so its body is never read."""

    def __init__(self, app, *, api_key: str, respond: Respond,
                 protect_metrics: bool = False):
        if not api_key:
            raise ValueError("the API key must be a non-empty string")
        self.app = app
        self.expected = api_key.encode("utf-8", "surrogateescape")
        self.respond = respond
        self.open = open_paths(protect_metrics)

    def authorized(self, headers) -> bool:
        for name, value in headers:
            if name == b"authorization":
                # The auth scheme is case-insensitive (RFC 7235).
                scheme, _, token = value.strip().partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    token.strip(), self.expected)
        return False

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["path"] in self.open
                or self.authorized(scope.get("headers", ()))):
            return await self.app(scope, receive, send)
        response = self.respond(
            "Unauthorized: a valid API key is needed (Authorization: Bearer "
            "...)", 401, headers={"WWW-Authenticate": "Bearer"})
        return await response(scope, receive, send)
