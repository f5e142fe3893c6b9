"""The TCP fault proxy, on real loopback sockets in front of a threaded echo server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.faultproxy import FaultProxy


class EchoServer:
    """Echoes every byte back; remembers everything it received."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.received = bytearray()
        self.closed_by_peer = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self.closed_by_peer.set()
                    return
                with self._lock:
                    self.received += data
                with contextlib.suppress(OSError):
                    conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(echo.port) as running:
        yield running


def connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def assert_broken(sock: socket.socket) -> None:
    """The peer closed or reset the connection (not a timeout)."""
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        assert sock.recv(1) == b""


def assert_refused(proxy: FaultProxy) -> None:
    """A new connection is closed at once (the reset may even beat connect() returning)."""
    try:
        sock = connect(proxy)
    except ConnectionResetError:
        return
    with sock:
        assert_broken(sock)


def wait_until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_pass_forwards_both_ways_including_large_payloads(proxy: FaultProxy) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB: more than the proxy's high-water mark
    with connect(proxy) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        sender.join()
    assert proxy.mode == "pass"


def test_half_close_is_passed_on(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        assert recv_exactly(sock, 10) == b"last words"
        assert sock.recv(1) == b""
    assert echo.closed_by_peer.wait(5)


def test_delay_holds_each_chunk_for_the_delay(proxy: FaultProxy) -> None:
    proxy.set_delay(0.3)
    with connect(proxy) as sock:
        started = time.monotonic()
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        # up 0.3 s and back down 0.3 s
        assert time.monotonic() - started >= 0.55
        proxy.set_pass()
        started = time.monotonic()
        sock.sendall(b"pong")
        assert recv_exactly(sock, 4) == b"pong"
        assert time.monotonic() - started < 0.25


def test_blackhole_keeps_connections_and_delivers_nothing_until_healed(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    with connect(proxy) as before:
        proxy.set_blackhole()
        with connect(proxy) as during:  # new connections are accepted too
            before.sendall(b"held-1")
            during.sendall(b"held-2")
            before.settimeout(0.4)
            with pytest.raises(TimeoutError):
                before.recv(1)
            assert echo.received == b""
            proxy.set_pass()
            before.settimeout(5)
            during.settimeout(5)
            assert recv_exactly(before, 6) == b"held-1"
            assert recv_exactly(during, 6) == b"held-2"


def test_cut_breaks_open_connections_and_refuses_new_ones_until_pass(
    proxy: FaultProxy,
) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert recv_exactly(sock, 1) == b"a"
        proxy.cut()
        assert_broken(sock)
    wait_until(lambda: proxy.open_connections == 0)
    assert_refused(proxy)
    proxy.set_pass()
    with connect(proxy) as sock:
        sock.sendall(b"back")
        assert recv_exactly(sock, 4) == b"back"


@pytest.mark.parametrize("forward", [True, False])
def test_cut_when_pattern_forwards_or_drops_the_matching_chunk(
    proxy: FaultProxy, echo: EchoServer, forward: bool
) -> None:
    fired = proxy.cut_when(b"COMMIT", forward=forward)
    with connect(proxy) as sock:
        sock.sendall(b"BEGIN;")
        assert recv_exactly(sock, 6) == b"BEGIN;"
        sock.sendall(b"COMMIT;")
        assert fired.wait(5)
        # The client never hears back, whatever the server did.
        assert_broken(sock)
    assert proxy.mode == "cut"
    if forward:
        wait_until(lambda: bytes(echo.received) == b"BEGIN;COMMIT;")
    else:
        time.sleep(0.2)
        assert bytes(echo.received) == b"BEGIN;"


def test_cut_when_matches_a_pattern_split_across_chunks(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    fired = proxy.cut_when(b"COMMIT")
    with connect(proxy) as sock:
        sock.sendall(b"xxCOM")
        assert recv_exactly(sock, 5) == b"xxCOM"
        assert not fired.is_set()
        sock.sendall(b"MITyy")
        assert fired.wait(5)


def test_unreachable_target_closes_the_client(echo: EchoServer) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with FaultProxy(dead_port) as proxy:
        assert_refused(proxy)


def test_close_releases_the_port_and_every_connection(echo: EchoServer) -> None:
    proxy = FaultProxy(echo.port).start()
    sock = connect(proxy)
    sock.sendall(b"x")
    assert recv_exactly(sock, 1) == b"x"
    proxy.close()
    proxy.close()  # idempotent
    assert_broken(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()


def test_negative_delay_is_rejected(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="delay"):
        proxy.set_delay(-1)
