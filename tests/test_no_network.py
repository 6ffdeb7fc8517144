"""The conftest guard makes network access fail, and leaves localhost open."""

import socket
import threading

import pytest

from tests.no_network import NetworkAccessError, is_local


def test_remote_connect_is_refused():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        with pytest.raises(NetworkAccessError, match="93.184.216.34"):
            s.connect(("93.184.216.34", 80))
        with pytest.raises(NetworkAccessError):
            s.connect_ex(("8.8.8.8", 53))


def test_remote_name_lookup_and_create_connection_are_refused():
    with pytest.raises(NetworkAccessError, match="huggingface.co"):
        socket.getaddrinfo("huggingface.co", 443)
    with pytest.raises(NetworkAccessError):
        socket.create_connection(("pypi.org", 443), timeout=1)


def test_http_client_is_refused():
    """What a library's download would do (urllib, as HF hub's fallbacks
    and pip do) fails before any byte leaves the machine."""
    import urllib.request
    with pytest.raises(Exception) as info:
        urllib.request.urlopen("https://huggingface.co/gpt2/resolve/main/"
                               "config.json", timeout=2)
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__ or getattr(e, "reason", None)
        if not isinstance(e, BaseException):
            e = None
    assert any("tests may not use the network" in str(x) for x in chain), (
        repr(info.value))


def test_localhost_stays_open():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        accepted = []
        t = threading.Thread(target=lambda: accepted.append(server.accept()))
        t.start()
        with socket.create_connection(("localhost", port), timeout=5) as c:
            c.sendall(b"ping")
        t.join(5)
        conn, _ = accepted[0]
        assert conn.recv(4) == b"ping"
        conn.close()


@pytest.mark.parametrize("host,local", [
    ("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", True),
    ("127.3.4.5", True), ("10.0.0.1", False), ("example.com", False),
    ("2001:db8::1", False)])
def test_is_local(host, local):
    assert is_local(host) is local
