"""Limits on client connections, below the ASGI app: what a production HTTP
server (nginx, Apache's mod_reqtimeout) has and uvicorn lacks.

- A request's headers must arrive within ``header_timeout`` seconds of the
  connection opening (or of the first byte of the next request on a
  kept-alive one), its body within ``body_timeout`` seconds of its headers;
  otherwise the server answers 408 and closes the connection. uvicorn
  alone times out only idle kept-alive connections (``timeout_keep_alive``):
  a client sending a header line every few seconds would keep its
  connection for as long as it liked.
- At most ``max_connections`` connections are open. One more closes the
  connection that has waited longest without a complete request (an idle
  kept-alive one, or one still sending its request); if every connection
  has a request in progress, the new one is answered 503 and closed. The
  default keeps the count below the process's file limit, so that slow
  clients can never use up the descriptors that /health and the engine
  need (accepting then fails and the listener pauses). The listen backlog
  (which is also how many connections asyncio accepts in one go) is kept
  small for the same reason.

`LimitedH11Protocol` is uvicorn's h11 protocol with these checks added at
the asyncio Protocol's own entry points; `uvicorn_options` gives the
``uvicorn.Config`` arguments.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
# uvicorn's default and vLLM's (VLLM_HTTP_TIMEOUT_KEEP_ALIVE).
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5.0
KEEP_ALIVE_VARIABLE = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
# Connections accepted in one go (and the listen backlog).
ACCEPT_BACKLOG = 128
# Descriptors left for the process's own files and an accept burst.
FD_RESERVE = 64 + 2 * ACCEPT_BACKLOG


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: assume a modest count
        return 64


def file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def most_connections() -> int:
    """The most connections the file limit leaves room for."""
    return file_limit() - open_descriptors() - FD_RESERVE


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The server's connection limits (flags of `jaxinfer serve`)."""
    # Open connections; None: as many as the file limit leaves room for.
    max_connections: int | None = None
    # Seconds for a request's headers to arrive (--request-header-timeout).
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    # Seconds for its body to arrive after them (--request-body-timeout).
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S
    # Seconds an idle kept-alive connection stays open (--timeout-keep-alive).
    timeout_keep_alive: float = DEFAULT_TIMEOUT_KEEP_ALIVE_S

    def __post_init__(self):
        for name in ("header_timeout", "body_timeout", "timeout_keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 "
                                 f"seconds, got {getattr(self, name)}")
        if self.max_connections is not None:
            room = most_connections()
            if not 1 <= self.max_connections <= room:
                raise ValueError(
                    f"--max-connections must be between 1 and {room} (the "
                    f"file limit, {file_limit()}, less the {FD_RESERVE} "
                    "descriptors kept for the server's own files); got "
                    f"{self.max_connections}: lower it or raise the file "
                    "limit (ulimit -n)")

    def resolved_max_connections(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        room = most_connections()
        if room < 16:
            raise ValueError(
                f"the file limit ({file_limit()}) leaves room for {room} "
                "connections: raise it (ulimit -n)")
        return room


def default_timeout_keep_alive() -> float:
    """vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE when set, else 5 s."""
    value = os.environ.get(KEEP_ALIVE_VARIABLE)
    if not value:
        return DEFAULT_TIMEOUT_KEEP_ALIVE_S
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{KEEP_ALIVE_VARIABLE} must be a number of "
                         f"seconds, got {value!r}") from None


def _raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP response, for a connection without a request to answer
    through the app: an error in OpenAI's shape, then the connection
    closes."""
    body = json.dumps({"error": {"message": message, "type": reason.replace(
        " ", "") + "Error", "param": None, "code": status}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
            ).encode() + body


def limited_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with ``limits`` (one class per server:
    it holds that server's queue of connections without a complete
    request)."""
    max_connections = limits.resolved_max_connections()
    # Connections without a complete request, longest waiting first.
    waiting: collections.OrderedDict[Any, None] = collections.OrderedDict()

    class LimitedH11Protocol(H11Protocol):
        _timer: Any = None
        _phase: str | None = None  # "headers", "body" or None (in the app)

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._wait("headers")
            if len(self.connections) > max_connections:
                self._make_room()

        def _make_room(self) -> None:
            for other in waiting:
                if other is not self:
                    other._close()
                    return
            self._close(_raw_error(
                503, "Service Unavailable", "the server has as many "
                "connections as it takes (--max-connections), each with a "
                "request in progress; retry later"))

        def data_received(self, data: bytes) -> None:
            if self._phase is None and self.conn.their_state is h11.IDLE:
                self._wait("headers")  # a kept-alive connection's next request
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def _follow(self) -> None:
            """Moves the clock with the request's state."""
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                if self._phase != "body":
                    self._wait("body")
            elif state is not h11.IDLE:  # complete (or the connection ends)
                self._done()
            elif self._phase is None and self.conn.our_state is h11.IDLE:
                # Idle between requests: uvicorn's keep-alive timer runs,
                # and the connection may be closed to make room.
                waiting[self] = None
                waiting.move_to_end(self)

        def _wait(self, phase: str) -> None:
            self._cancel()
            self._phase = phase
            timeout = (limits.header_timeout if phase == "headers"
                       else limits.body_timeout)
            self._timer = self.loop.call_later(timeout, self._timed_out)
            waiting[self] = None
            waiting.move_to_end(self)

        def _done(self) -> None:
            self._cancel()
            self._phase = None
            waiting.pop(self, None)

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            phase = self._phase
            timeout, flag = ((limits.header_timeout, "--request-header-timeout")
                             if phase == "headers" else
                             (limits.body_timeout, "--request-body-timeout"))
            started = self.cycle is not None and self.cycle.response_started
            self._close(None if started else _raw_error(
                408, "Request Timeout", f"the request's {phase} did not "
                f"arrive within {timeout:g} s ({flag}); send requests whole"))

        def _close(self, response: bytes | None = None) -> None:
            self._done()
            if not self.transport.is_closing():
                if response is not None:
                    self.transport.write(response)
                self.transport.close()

        def connection_lost(self, exc) -> None:
            self._done()
            super().connection_lost(exc)

    return LimitedH11Protocol


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments that apply ``limits``."""
    return {"http": limited_protocol(limits), "backlog": ACCEPT_BACKLOG,
            "timeout_keep_alive": limits.timeout_keep_alive}


def add_connection_flags(p) -> None:
    """The flags of ``ConnectionLimits`` on an argparse parser."""
    p.add_argument("--max-connections", type=int, default=None,
                   help="most client connections open at once; one more "
                   "closes the one waiting longest without a complete "
                   "request (default: as many as the file limit leaves "
                   f"room for, less {FD_RESERVE} descriptors)")
    p.add_argument("--request-header-timeout", type=float,
                   default=DEFAULT_HEADER_TIMEOUT_S,
                   help="seconds for a request's headers to arrive; then 408 "
                   "and the connection closes (default: %(default)s)")
    p.add_argument("--request-body-timeout", type=float,
                   default=DEFAULT_BODY_TIMEOUT_S,
                   help="seconds for a request's body to arrive after its "
                   "headers; then 408 (default: %(default)s)")
    p.add_argument("--timeout-keep-alive", type=float, default=None,
                   help="seconds an idle kept-alive connection stays open "
                   f"(default: ${KEEP_ALIVE_VARIABLE}, as vLLM, else "
                   f"{DEFAULT_TIMEOUT_KEEP_ALIVE_S:g})")


def limits_from(ns) -> ConnectionLimits:
    """The limits the parsed flags name (ValueError for bad values)."""
    keep_alive = ns.timeout_keep_alive
    return ConnectionLimits(
        max_connections=ns.max_connections,
        header_timeout=ns.request_header_timeout,
        body_timeout=ns.request_body_timeout,
        timeout_keep_alive=(default_timeout_keep_alive() if keep_alive is None
                            else keep_alive))
