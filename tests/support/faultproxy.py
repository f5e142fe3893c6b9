"""A TCP fault proxy on loopback: pass, delay, blackhole or cut, switchable at runtime.

There is no toxiproxy or netem on the test machines, so the fault suite puts
this proxy between a client and a real server (PostgreSQL, or a Kafka broker
started with ``advertised_port=proxy.port``) and breaks the network on cue:

``pass``
    forward bytes both ways as they come.
``delay(s)``
    deliver every chunk ``s`` seconds after it arrived (latency, not a
    throughput cap: later chunks keep flowing behind it).
``blackhole``
    keep and accept connections but deliver nothing. Bytes that arrive are
    *held*, as TCP would keep retransmitting them, and are delivered when the
    mode goes back to ``pass``/``delay`` — a healed partition, not a corrupted
    stream.
``cut``
    reset every open connection (both ends see ECONNRESET/EOF) and close each
    new one at once, until the mode is set back.

:meth:`FaultProxy.cut_when` arms a one-shot trigger: the first client chunk
containing a byte pattern (``b"COMMIT"``) is forwarded to the server — or
dropped — and then everything is cut. That is how a test loses the
connection *during* a PostgreSQL COMMIT, the ambiguous case.

One selector thread does all socket work; other threads only change the mode
and wake it through a socket pair, so no socket is touched by two threads.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

_CHUNK = 65536
_HIGH_WATER = 1 << 20
"""Stop reading a side while this many bytes wait to go the other way."""
_HELD = float("inf")
"""Due time of a chunk held by the blackhole."""


@dataclass
class _Direction:
    """Bytes travelling from ``src`` to ``dst`` of one link."""

    src: socket.socket
    dst: socket.socket
    name: str  # "up" (client -> server) or "down"
    pending: deque[tuple[float, bytes]] = field(default_factory=deque)
    out: bytearray = field(default_factory=bytearray)
    eof: bool = False  # src sent FIN
    shut: bool = False  # FIN passed on to dst
    tail: bytes = b""  # last bytes seen, to match a trigger across chunk boundaries

    def buffered(self) -> int:
        return len(self.out) + sum(len(c) for _, c in self.pending)


@dataclass
class _Link:
    """One proxied connection: the accepted client socket and its upstream socket."""

    client: socket.socket
    upstream: socket.socket
    connecting: bool = True
    up: _Direction = field(init=False)
    down: _Direction = field(init=False)

    def __post_init__(self) -> None:
        self.up = _Direction(self.client, self.upstream, "up")
        self.down = _Direction(self.upstream, self.client, "down")


@dataclass
class _Trigger:
    pattern: bytes
    forward: bool
    fired: threading.Event


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (linger 0): the peer sees the connection break."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``target``, with faults switchable from any thread.

    Args:
        target: ``(host, port)`` of the real server, or just its port on 127.0.0.1;
            ``None`` to set :attr:`target` later, before :meth:`start` (a Kafka
            broker must know the proxy's port before it has a port of its own).
        port: where to listen (0: a free port, read it from :attr:`port`).

    Use as a context manager, or call :meth:`start` and :meth:`close`.
    """

    def __init__(self, target: tuple[str, int] | int | None, *, port: int = 0) -> None:
        self.target = ("127.0.0.1", target) if isinstance(target, int) else (target or ("", 0))
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._state = ("pass", 0.0)  # (mode, delay), replaced as one tuple
        self._epoch = 0  # bumped on every mode change; the loop reacts once per change
        self._trigger: _Trigger | None = None
        self._links: list[_Link] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"faultproxy-{self.port}")
        self.accepted = 0
        """Connections accepted so far (including ones refused while cut)."""

    # -- control (any thread) --

    @property
    def address(self) -> str:
        """``127.0.0.1:port``, for a client's configuration."""
        return f"127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        """``pass``, ``delay``, ``blackhole`` or ``cut``."""
        return self._state[0]

    @property
    def open_connections(self) -> int:
        """Links currently proxied."""
        with self._lock:
            return len(self._links)

    def start(self) -> FaultProxy:
        """Start the proxy thread; return ``self``."""
        if not self.target[1]:
            raise ValueError("set the proxy's target before starting it")
        self._thread.start()
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def set_pass(self) -> None:
        """Forward everything (held bytes from a blackhole go out now)."""
        self._set("pass")

    def set_delay(self, seconds: float) -> None:
        """Deliver each chunk ``seconds`` after it arrived."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, got {seconds!r}")
        self._set("delay", seconds)

    def set_blackhole(self) -> None:
        """Accept and keep connections, deliver nothing (bytes are held until pass/delay)."""
        self._set("blackhole")

    def cut(self) -> None:
        """Reset all connections and refuse new ones until another mode is set."""
        self._set("cut")

    def cut_when(self, pattern: bytes, *, forward: bool = True) -> threading.Event:
        """Arm a one-shot cut on the first client->server chunk containing ``pattern``.

        Args:
            pattern: bytes to look for in what clients send (e.g. ``b"COMMIT"``).
            forward: deliver that chunk (and everything before it) to the server
                before cutting — the server acts on it, the client never hears
                back. ``False`` drops it: the server never sees it.

        Returns:
            An event set when the trigger has fired (the mode is then ``cut``).
        """
        if not pattern:
            raise ValueError("pattern must not be empty")
        trigger = _Trigger(pattern, forward, threading.Event())
        with self._lock:
            self._trigger = trigger
        return trigger.fired

    def close(self) -> None:
        """Stop the thread and close every socket (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(10)
        for link in self._links:
            _reset(link.client)
            _reset(link.upstream)
        self._links.clear()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

    def _set(self, mode: str, delay: float = 0.0) -> None:
        with self._lock:
            self._state = (mode, delay)
            self._epoch += 1
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the selector thread --

    def _loop(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        seen_epoch = -1
        while not self._closed:
            with self._lock:
                (mode, delay), epoch = self._state, self._epoch
            if epoch != seen_epoch:
                seen_epoch = epoch
                self._apply_mode(mode, delay)
            for key, mask in self._selector.select(self._timeout()):
                # The mode may have changed while select() waited: bytes read
                # now follow the mode set before they were read, so take it
                # afresh (the change itself is applied at the top of the loop).
                if key.data == "listener":
                    self._accept(self._state[0])
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._on_ready(key.data, key.fileobj, mask, *self._state)
            self._flush_due()
            self._reregister()

    def _timeout(self) -> float | None:
        due = [
            d.pending[0][0]
            for link in self._links
            for d in (link.up, link.down)
            if d.pending and d.pending[0][0] != _HELD
        ]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _apply_mode(self, mode: str, delay: float) -> None:
        if mode == "cut":
            for link in list(self._links):
                self._drop(link)
        elif mode in ("pass", "delay"):
            release = time.monotonic() + (delay if mode == "delay" else 0.0)
            for link in self._links:
                for d in (link.up, link.down):
                    d.pending = deque((release if t == _HELD else t, c) for t, c in d.pending)

    def _accept(self, mode: str) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        self.accepted += 1
        if mode == "cut":
            _reset(client)
            return
        client.setblocking(False)
        upstream = socket.socket()
        upstream.setblocking(False)
        err = upstream.connect_ex(self.target)
        if err not in (0, errno.EINPROGRESS):
            _reset(client)
            upstream.close()
            return
        link = _Link(client, upstream)
        with self._lock:
            self._links.append(link)
        self._selector.register(client, selectors.EVENT_READ, link)
        self._selector.register(upstream, selectors.EVENT_WRITE, link)

    def _on_ready(
        self, link: _Link, sock: object, mask: int, mode: str, delay: float
    ) -> None:  # fmt: skip
        if link not in self._links:
            return  # dropped earlier in this round
        if link.connecting and sock is link.upstream:
            if link.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._drop(link)
                return
            link.connecting = False
        direction = link.up if sock is link.client else link.down
        if mask & selectors.EVENT_READ and not direction.eof:
            self._read(link, direction, mode, delay)
        if link in self._links and mask & selectors.EVENT_WRITE:
            other = link.down if sock is link.client else link.up
            self._write(link, other)

    def _read(self, link: _Link, d: _Direction, mode: str, delay: float) -> None:
        try:
            chunk = d.src.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            self._drop(link)
            return
        if not chunk:
            d.eof = True
            return
        now = time.monotonic()
        due = {"pass": now, "delay": now + delay}.get(mode, _HELD)
        d.pending.append((due, chunk))
        trigger = self._trigger
        if trigger is not None and d.name == "up" and trigger.pattern in d.tail + chunk:
            self._fire(link, d, trigger)
            return
        d.tail = (d.tail + chunk)[-(len(trigger.pattern) - 1) :] if trigger else b""

    def _fire(self, link: _Link, d: _Direction, trigger: _Trigger) -> None:
        with self._lock:
            self._trigger = None
            self._state = ("cut", 0.0)
            self._epoch += 1
        if trigger.forward:
            # Everything the client sent up to and including the pattern
            # reaches the server, then FIN: PostgreSQL executes a COMMIT it has
            # read before it notices the end of the stream.
            data = bytes(d.out) + b"".join(c for _, c in d.pending)
            d.out.clear()
            d.pending.clear()
            with contextlib.suppress(OSError):
                d.dst.setblocking(True)
                d.dst.settimeout(5)
                d.dst.sendall(data)
                d.dst.shutdown(socket.SHUT_WR)
        # This link goes now: the server end with a plain close (an RST could
        # overtake the COMMIT still unread in the server's socket buffer), the
        # client end with a reset. The other links go when the loop sees "cut".
        with self._lock:
            self._links.remove(link)
        for sock in (link.client, link.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
        _reset(link.client)
        if trigger.forward:
            link.upstream.close()
        else:
            _reset(link.upstream)
        trigger.fired.set()

    def _write(self, link: _Link, d: _Direction) -> None:
        if not d.out or link.connecting:
            return
        try:
            sent = d.dst.send(d.out)
        except BlockingIOError:
            return
        except OSError:
            self._drop(link)
            return
        del d.out[:sent]

    def _flush_due(self) -> None:
        now = time.monotonic()
        for link in list(self._links):
            for d in (link.up, link.down):
                while d.pending and d.pending[0][0] <= now:
                    d.out += d.pending.popleft()[1]
                if d.out:
                    self._write(link, d)
                if link not in self._links:
                    break
                if d.eof and not d.out and not d.pending and not d.shut and not link.connecting:
                    d.shut = True
                    with contextlib.suppress(OSError):
                        d.dst.shutdown(socket.SHUT_WR)
            if link in self._links and link.up.shut and link.down.shut:
                self._drop(link, graceful=True)

    def _reregister(self) -> None:
        for link in self._links:
            for sock, inbound, outbound in (
                (link.client, link.up, link.down),
                (link.upstream, link.down, link.up),
            ):
                events = 0
                if not inbound.eof and inbound.buffered() < _HIGH_WATER:
                    events |= selectors.EVENT_READ
                if outbound.out or (sock is link.upstream and link.connecting):
                    events |= selectors.EVENT_WRITE
                if sock is link.upstream and link.connecting:
                    events = selectors.EVENT_WRITE
                self._update(sock, events, link)

    def _update(self, sock: socket.socket, events: int, link: _Link) -> None:
        try:
            key = self._selector.get_key(sock)
        except KeyError:
            if events:
                self._selector.register(sock, events, link)
            return
        if not events:
            self._selector.unregister(sock)
        elif key.events != events:
            self._selector.modify(sock, events, link)

    def _drop(self, link: _Link, *, graceful: bool = False) -> None:
        with self._lock:
            if link in self._links:
                self._links.remove(link)
        for sock in (link.client, link.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            if graceful:
                sock.close()
            else:
                _reset(sock)
