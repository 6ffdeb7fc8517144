"""Makes "no test touches the network" enforced: while installed, a socket
connect to (or a name lookup of) anything but this machine raises
``NetworkAccessError``. Localhost stays open for the server tests.

Installed for the whole session by ``tests/conftest.py``. It guards this
process only; a subprocess a test starts is not covered.
"""

from __future__ import annotations

import ipaddress
import socket

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


class NetworkAccessError(ConnectionError):
    """A test tried to reach a host other than this machine. An OSError, as
    an unreachable network would raise, so that socket helpers close what
    they opened; the message says where the guard lives."""


def is_local(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    host = str(host).split("%")[0]  # drop an IPv6 zone id
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback or addr.is_unspecified


def _check(sock, address):
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # unix sockets and the like never leave the machine
    host = address[0] if isinstance(address, tuple) else address
    if not is_local(host):
        raise NetworkAccessError(
            f"tests may not use the network: connect to {address!r} refused "
            "(only localhost is allowed; see tests/no_network.py)")


_originals: dict = {}


def install() -> None:
    if _originals:
        return
    _originals.update(connect=socket.socket.connect,
                      connect_ex=socket.socket.connect_ex,
                      getaddrinfo=socket.getaddrinfo)

    def connect(self, address):
        _check(self, address)
        return _originals["connect"](self, address)

    def connect_ex(self, address):
        _check(self, address)
        return _originals["connect_ex"](self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host is not None and not is_local(host):
            raise NetworkAccessError(
                f"tests may not use the network: name lookup of {host!r} "
                "refused (only localhost is allowed; see tests/no_network.py)")
        return _originals["getaddrinfo"](host, *args, **kwargs)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.getaddrinfo = getaddrinfo


def uninstall() -> None:
    if not _originals:
        return
    socket.socket.connect = _originals.pop("connect")
    socket.socket.connect_ex = _originals.pop("connect_ex")
    socket.getaddrinfo = _originals.pop("getaddrinfo")
