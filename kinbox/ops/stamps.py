"""Stage stamps: when sampled events passed each stage of a worker (a diagnostic, off by default).

``KINBOX_STAGE_STAMPS=PATH`` makes ``kinbox worker`` note, for every event
whose offset is a multiple of ``KINBOX_STAGE_STAMPS_EVERY`` (default 1: every
event), the wall clock (seconds since the epoch) at each stage it passes::

    fetched       the consumer's poll returned it (it goes into its lane at once)
    batch         its partition batch began on a batch thread (before_batch)
    handler       the handler was called with it
    commit        the COMMIT of the transaction that applied it returned
    offset-sent   an offset past it was sent to the broker
    offset-acked  the broker confirmed an offset past it

and appends them to ``PATH``, one line each: ``stage topic partition offset
seconds``. Lines are written in blocks as they accumulate, on a thread of
their own (so a block never holds up a poll), and the rest when the worker
stops; the members of ``--processes N`` append to the same file.
Set beside the producer's own clock (the record's timestamp, or a time in
its payload) and the broker's append time (a ``LogAppendTime`` topic), the
stamps say where an event's latency goes.

Both variables are read once, at start-up. When ``KINBOX_STAGE_STAMPS`` is
unset nothing is installed: no wrapper around the consumer, no middleware,
no branch on the path of a record. Set, it adds a wrapper around the
consumer and a middleware (:class:`StampMiddleware`), each looking at a
record's offset once per stage; with a sample of 1 in 100 their cost is
lost in the noise of a run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from kinbox.core.errors import ConfigurationError, TransportError
from kinbox.core.event import Event
from kinbox.core.outcome import Step
from kinbox.core.record import Record
from kinbox.core.transport import ForwardingTransport, Partition, RebalanceListener, Transport
from kinbox.middleware.base import Middleware, WorkerInfo

log = logging.getLogger(__name__)

ENV = "KINBOX_STAGE_STAMPS"
"""Where the stamps go; unset: no stamps."""

EVERY_ENV = "KINBOX_STAGE_STAMPS_EVERY"
"""Stamp the events whose offset is a multiple of this (default 1: all)."""

STAGES = ("fetched", "batch", "handler", "commit", "offset-sent", "offset-acked")
"""The stages, in the order an event passes them."""

FLUSH_EVERY = 2_000
"""Stamps kept before a block of them is handed to the writing thread.

The thread formats a block holding the interpreter lock, and the threads
that run the events wait for it meanwhile: a block is kept to what formats
in a millisecond or two.
"""

_Row = tuple[str, str, int, int, float]


class StageStamps:
    """The stamps of one worker process, and where they go.

    Args:
        path: the file they are appended to.
        every: stamp the offsets that are a multiple of this.
    """

    def __init__(self, path: str, every: int = 1) -> None:
        if every < 1:
            raise ConfigurationError(f"{EVERY_ENV}={every!r} is not allowed: a whole number >= 1")
        self.path = path
        self.every = every
        self._rows: list[_Row] = []
        self._writing = threading.Lock()
        # Blocks are written on a thread of their own: the file's I/O on the
        # polling thread would hold up every partition's records meanwhile.
        self._writer: ThreadPoolExecutor | None = None  # made for the first block

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StageStamps | None:
        """The stamps ``env`` asks for, or ``None`` (nothing to install).

        Raises:
            ConfigurationError: the sample is not a whole number >= 1.
        """
        path = env.get(ENV)
        if not path:
            return None
        raw = env.get(EVERY_ENV, "1")
        try:
            every = int(raw)
        except ValueError:
            raise ConfigurationError(
                f"{EVERY_ENV}={raw!r} is not allowed: a whole number >= 1"
            ) from None
        return cls(path, every)

    def sampled(self, offset: int) -> bool:
        """Whether the event at ``offset`` is stamped."""
        return offset % self.every == 0

    def stamp(self, stage: str, topic: str, partition: int, offset: int, when: float) -> None:
        """Note that the event at ``topic[partition]@offset`` passed ``stage`` at ``when``."""
        self._rows.append((stage, topic, partition, offset, when))  # atomic under the GIL

    def hand_off(self) -> None:
        """Once :data:`FLUSH_EVERY` stamps are noted, queue them for the writing thread."""
        if len(self._rows) < FLUSH_EVERY:
            return
        rows, self._rows = self._rows, []
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="kinbox-stamps")
        self._writer.submit(self._write_block, rows)

    def flush(self) -> None:
        """Write every stamp noted so far, after the blocks handed off before it."""
        rows, self._rows = self._rows, []
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self._write(rows)

    def _write_block(self, rows: list[_Row]) -> None:
        try:
            self._write(rows)
        except OSError as exc:  # a diagnostic: the worker goes on without it
            log.warning("could not write %d stage stamps to %s: %s", len(rows), self.path, exc)

    def _write(self, rows: list[_Row]) -> None:
        if not rows:
            return
        with self._writing, open(self.path, "a") as out:
            out.write("".join(f"{s} {t} {p} {o} {w:.6f}\n" for s, t, p, o, w in rows))

    def transport(self, inner: Transport) -> Transport:
        """``inner``, stamping ``fetched`` and the offset commits."""
        return StampedTransport(inner, self)

    def middleware(self) -> Middleware:
        """The middleware stamping ``batch``, ``handler`` and ``commit``."""
        return StampMiddleware(self)


class StampMiddleware(Middleware):
    """Stamps each sampled event's batch start, handler call and COMMIT; writes at the end."""

    def __init__(self, stamps: StageStamps) -> None:
        self._stamps = stamps

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Stamp ``batch``."""
        now = time.time()
        for record in records:
            if self._stamps.sampled(record.offset):
                self._stamps.stamp("batch", topic, partition, record.offset, now)

    def around_event(self, event: Event, call_next: Callable[[Event], object]) -> object:
        """Stamp ``handler``, then call it."""
        if self._stamps.sampled(event.offset):
            self._stamps.stamp("handler", event.topic, event.partition, event.offset, time.time())
        return call_next(event)

    def around_events(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], object]
    ) -> object:
        """Stamp ``handler`` for the batch handler's events, then call it."""
        self._handler(events)
        return call_next(events)

    async def around_event_async(
        self, event: Event, call_next: Callable[[Event], Awaitable[object]]
    ) -> object:
        """Stamp ``handler``, then await the async handler, on its loop."""
        self._handler((event,))
        return await call_next(event)

    async def around_events_async(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], Awaitable[object]]
    ) -> object:
        """Stamp ``handler`` for the async batch handler's events, then await it."""
        self._handler(events)
        return await call_next(events)

    def _handler(self, events: Sequence[Event]) -> None:
        now = time.time()
        for event in events:
            if self._stamps.sampled(event.offset):
                self._stamps.stamp("handler", event.topic, event.partition, event.offset, now)

    def after_step(self, step: Step) -> None:
        """Stamp ``commit`` when a COMMIT succeeded."""
        if step.name != "commit" or step.error is not None:
            return
        when = step.ended / 1e9
        for event in step.events:
            if self._stamps.sampled(event.offset):
                self._stamps.stamp("commit", event.topic, event.partition, event.offset, when)

    def after_worker_stop(self, worker: WorkerInfo, error: BaseException | None) -> None:
        """Write what is left."""
        self._stamps.flush()


class StampedTransport(ForwardingTransport):
    """A :class:`~kinbox.core.transport.Transport` stamping ``fetched`` and the offset commits.

    Every call it stamps in runs on the polling thread (the rebalance
    listener's too), so its bookkeeping needs no lock.
    """

    def __init__(self, inner: Transport, stamps: StageStamps) -> None:
        super().__init__(inner)
        self._stamps = stamps
        # Sampled offsets per partition not yet covered by a commit sent, and
        # those sent and not yet confirmed.
        self._unsent: dict[Partition, deque[int]] = {}
        self._unacked: dict[Partition, deque[int]] = {}

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """See :meth:`Transport.subscribe`."""
        self._inner.subscribe(topics, _Listener(listener, self._acked))

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """See :meth:`Transport.poll`; stamps ``fetched``."""
        self._stamps.hand_off()
        records = self._inner.poll(max_messages, timeout)
        now = time.time()
        for record in records:
            if self._stamps.sampled(record.offset):
                self._stamps.stamp("fetched", record.topic, record.partition, record.offset, now)
                self._unsent.setdefault((record.topic, record.partition), deque()).append(
                    record.offset
                )
        return records

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """See :meth:`Transport.commit`; stamps ``offset-sent`` (and ``offset-acked``)."""
        self._inner.commit(offsets, asynchronous=asynchronous)
        now = time.time()
        for (topic, partition), offset in offsets.items():
            unsent = self._unsent.get((topic, partition))
            unacked = self._unacked.setdefault((topic, partition), deque())
            while unsent and unsent[0] < offset:
                sent = unsent.popleft()
                self._stamps.stamp("offset-sent", topic, partition, sent, now)
                unacked.append(sent)
        if not asynchronous:
            self._acked(offsets)

    def _acked(self, offsets: Mapping[Partition, int]) -> None:
        now = time.time()
        for (topic, partition), offset in offsets.items():
            unacked = self._unacked.get((topic, partition))
            while unacked and unacked[0] < offset:
                self._stamps.stamp("offset-acked", topic, partition, unacked.popleft(), now)

    def seek(self, partition: Partition, offset: int) -> None:
        """See :meth:`Transport.seek`; a rewound partition's stamps start again."""
        self._unsent.pop(partition, None)
        self._inner.seek(partition, offset)


class _Listener:
    """The runner's listener, with the broker's commit answers stamped on the way."""

    def __init__(
        self, inner: RebalanceListener, acked: Callable[[Mapping[Partition, int]], None]
    ) -> None:
        self._inner, self._acked = inner, acked

    def on_assigned(self, partitions: list[Partition]) -> None:
        self._inner.on_assigned(partitions)

    def on_revoked(self, partitions: list[Partition]) -> None:
        self._inner.on_revoked(partitions)

    def on_lost(self, partitions: list[Partition]) -> None:
        self._inner.on_lost(partitions)

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        if error is None:
            self._acked(offsets)
        self._inner.on_committed(offsets, error)


def install(transport: Transport, add_middleware: Callable[[Middleware], None]) -> Transport:
    """Install the stamps the environment asks for; return the transport to run with.

    Raises:
        ConfigurationError: ``KINBOX_STAGE_STAMPS_EVERY`` is not a whole number >= 1.
    """
    stamps = StageStamps.from_env(os.environ)
    if stamps is None:
        return transport
    add_middleware(stamps.middleware())
    return stamps.transport(transport)
