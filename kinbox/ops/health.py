"""Health endpoints for the worker and the relay: ``/livez`` and ``/readyz`` (``--health-port``).

Off by default. A tiny HTTP server (the standard library's, on a daemon
thread) answers from a :class:`Health` object that the loop feeds; the
server never looks into the runner or the relay.

``/livez``: 200 while the loop has *turned* within ``live_timeout`` seconds,
503 after. For the worker, a turn is a call of the consumer's ``poll()``
entering or returning (:class:`ObservedTransport` wraps the transport, so the
runner needs no hook). A slow handler does not stop it: after a second the
runner pauses the partitions and keeps polling so the member stays in the
group, and each of those polls is a turn. What does stop it is the polling
thread itself being stuck — in a rebalance callback waiting for a batch
(bounded by the revoke wait), in a hung client call, in a deadlock. The
default threshold is the consumer's ``max.poll.interval.ms``: a member that
has not polled for that long has been expelled by the broker anyway. For the
relay, a turn is a round of its loop, a batch, a slice of its idle wait or a
cleanup batch.

``/readyz``: 200 when the loop is live, holds something (the worker:
partitions; the relay: lanes) and the database answers (a fresh connection,
checked at most every :data:`DB_CHECK_EVERY` seconds). A member with nothing
assigned is alive but not ready — use it to see that, never to restart it
(see the Kubernetes probes in ``docs/operations.md``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from kinbox.core.transport import ForwardingTransport, Partition, RebalanceListener

if TYPE_CHECKING:
    from kinbox.core.errors import TransportError
    from kinbox.core.record import Record
    from kinbox.core.transport import Transport

log = logging.getLogger(__name__)

DB_CHECK_EVERY = 2.0
"""Seconds a database check's answer is reused: probes never queue connections."""


class Health:
    """What the endpoints report; the loop calls :meth:`turned` and :meth:`holding`.

    Args:
        live_timeout: longest gap between two turns before ``/livez`` fails.
        holds: what the loop needs to hold to be ready ("partitions", "lanes").
        database: returns ``None`` when the database answers, else why not.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        live_timeout: float,
        holds: str,
        database: Callable[[], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.live_timeout = live_timeout
        self._holds = holds
        self._database = database
        self._clock = clock
        self._turned = clock()  # start-up counts as a turn
        self._held = 0
        self._lock = threading.Lock()
        self._db_checked = -DB_CHECK_EVERY
        self._db_error: str | None = None

    def turned(self) -> None:
        """The loop made progress (cheap: one clock reading and a store)."""
        self._turned = self._clock()

    def holding(self, count: int) -> None:
        """The loop holds ``count`` partitions (or lanes) now."""
        self._held = count

    def live(self) -> tuple[bool, str]:
        """Whether the loop turned recently, and what to say about it."""
        gap = self._clock() - self._turned
        if gap > self.live_timeout:
            return False, f"the loop has not turned for {gap:.1f}s (threshold {self.live_timeout}s)"
        return True, f"the loop turned {gap:.1f}s ago"

    def ready(self) -> tuple[bool, str]:
        """Whether live, holding something and the database answers; why, either way."""
        live, why = self.live()
        if not live:
            return False, why
        if self._held <= 0:
            return False, f"no {self._holds} assigned"
        error = self._check_database()
        if error is not None:
            return False, f"database unreachable: {error}"
        return True, f"{self._held} {self._holds} held, database reachable"

    def _check_database(self) -> str | None:
        if self._database is None:
            return None
        with self._lock:  # one check at a time; concurrent probes share its answer
            if self._clock() - self._db_checked >= DB_CHECK_EVERY:
                self._db_error = self._database()
                self._db_checked = self._clock()
            return self._db_error


class HealthServer:
    """Serves ``/livez`` and ``/readyz`` for ``health`` on ``port`` (0: any free port)."""

    def __init__(self, health: Health, port: int, host: str = "0.0.0.0") -> None:
        handler = _handler_for(health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kinbox-health", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Start serving on a daemon thread; return self."""
        self._thread.start()
        log.info("health endpoints on port %d: /livez, /readyz", self.port)
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler_for(health: Health) -> type[BaseHTTPRequestHandler]:
    checks: Mapping[str, Callable[[], tuple[bool, str]]] = {
        "/livez": health.live,
        "/readyz": health.ready,
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            check = checks.get(self.path.split("?", 1)[0])
            if check is None:
                self._answer(404, "not found: try /livez or /readyz")
                return
            ok, why = check()
            self._answer(200 if ok else 503, ("ok: " if ok else "fail: ") + why)

        def _answer(self, code: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("health probe: " + format, *args)

    return Handler


class ObservedTransport(ForwardingTransport):
    """A :class:`~kinbox.core.transport.Transport` that feeds :class:`Health`, otherwise unchanged.

    Each ``poll()`` entering and returning is a turn; the rebalance callbacks
    tell how many partitions the member holds (after the runner has handled
    them, so a revoke still counts as held while its offsets are committed).
    """

    def __init__(self, inner: Transport, health: Health) -> None:
        super().__init__(inner)
        self._health = health
        self._held: set[Partition] = set()

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """See :meth:`Transport.subscribe`."""
        self._inner.subscribe(topics, _Listener(listener, self._held, self._health))

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """See :meth:`Transport.poll`."""
        self._health.turned()
        try:
            return self._inner.poll(max_messages, timeout)
        finally:
            self._health.turned()

    def close(self) -> None:
        """See :meth:`Transport.close`."""
        self._inner.close()
        self._held.clear()
        self._health.holding(0)


class _Listener:
    def __init__(self, inner: RebalanceListener, held: set[Partition], health: Health) -> None:
        self._inner, self._held, self._health = inner, held, health

    def on_assigned(self, partitions: list[Partition]) -> None:
        self._inner.on_assigned(partitions)
        self._held.update(partitions)
        self._health.holding(len(self._held))

    def on_revoked(self, partitions: list[Partition]) -> None:
        self._inner.on_revoked(partitions)
        self._held.difference_update(partitions)
        self._health.holding(len(self._held))

    def on_lost(self, partitions: list[Partition]) -> None:
        self._inner.on_lost(partitions)
        self._held.difference_update(partitions)
        self._health.holding(len(self._held))

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        self._inner.on_committed(offsets, error)
