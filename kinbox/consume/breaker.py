"""The circuit breaker: a handler that fails for every event must not empty the topic.

A bad deploy, or a dependency every handler call needs being down, makes the
handler fail for every event. Each event would then be tried
``max_attempts`` times and dead-lettered, one after another on every
partition, until the whole topic sits in its dead-letter topic waiting for a
replay. The breaker stops that early::

    closed ──(N events in a row failed)──► open ──(pause over)──► half-open
      ▲                                     ▲                        │
      └────────(the probe event applied)────┼────────────────────────┤
                                            └──(the probe failed)────┘

*Closed*: the breaker counts distinct events whose handler failed — a try
that failed (to be tried again) or an event dead-lettered because its tries
ran out — with no event applied in between, across every partition of the
member. A committed handler success starts the count again: a partition
batch that applied any event counts none of its own failures, so poison
events scattered among healthy ones (each dead-lettered) never open it.
*Open*: after ``failures`` of them, every assigned partition is paused for
``pause`` seconds. The member keeps polling, so it stays in the group (and
keeps committing what it applied); nothing is fetched, tried or
dead-lettered meanwhile. *Half-open*: then one event — the first record the
next poll returns — is let through, and the records fetched beside it are
put back. If its handler commits, the breaker closes and every partition
resumes; if it fails, the breaker opens again for another ``pause``.

What does not count: an outage (the database or the broker down, a dead
letter the broker will not take: the partitions wait for those anyway), a
record without a valid id, a duplicate, and an event the handler gave up on
purpose (``raise DeadLetter(...)``: a verdict, not a failure).

The breaker is consulted by the runner at three points: :meth:`gate` before
each poll (holds the partitions, or lets them go), :meth:`admit` over each
poll's batches (the half-open probe) and :meth:`observe` after each
partition batch. It holds partitions through the
:class:`~kinbox.consume.pauses.PauseLedger`, so letting one go never undoes
another part's pause: a partition whose lane is full, or which backs off,
stays paused. Driver-free: it rewinds through
:class:`~kinbox.core.transport.Transport` only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Set
from enum import Enum

from kinbox.consume.pauses import PauseLedger, Reason
from kinbox.core.describe import describe
from kinbox.core.letter import HANDLER_ERROR, RETRIES_EXHAUSTED
from kinbox.core.outcome import BatchResult
from kinbox.core.record import Position, Record
from kinbox.core.transport import Partition, Transport

log = logging.getLogger(__name__)

_FAILED_LETTERS = frozenset({HANDLER_ERROR, RETRIES_EXHAUSTED})
"""Dead-letter reasons that mean the handler failed (its tries ran out)."""


class State(Enum):
    """Where the breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Breaker:
    """Counts handler failures across events; pauses the member when they run on.

    Args:
        transport: the consumer, to rewind partitions.
        pauses: where the partitions it holds are wanted paused.
        failures: distinct events failing in a row that open the breaker
            (0: never open).
        pause: seconds the breaker stays open before it lets one event through.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        transport: Transport,
        pauses: PauseLedger,
        failures: int,
        pause: float,
        clock: Callable[[], float],
    ) -> None:
        self._transport = transport
        self._pauses = pauses
        self._failures = failures
        self._pause = pause
        self._clock = clock
        self.state = State.CLOSED
        self._failing: dict[Position, str] = {}  # the run of failed events, and why the last one
        self._until = 0.0  # when an open breaker lets its probe through
        self._probe: Position | None = None  # the event let through, while its batch runs

    @property
    def held(self) -> Set[Partition]:
        """Partitions the breaker holds paused (a full lane or a backoff may hold them too)."""
        return self._pauses.holding(Reason.BREAKER)

    def gate(self) -> None:
        """Before a poll: hold every assigned partition while open, else let them go."""
        if self.state is State.OPEN and self._clock() >= self._until:
            self.state = State.HALF_OPEN
            log.warning(
                "circuit breaker half-open after %.1fs: trying one event; if its handler "
                "succeeds every partition resumes, if it fails the breaker opens again",
                self._pause,
            )
        if self.state is State.OPEN:
            self._pauses.want(Reason.BREAKER, self._pauses.assigned)
        elif self._probe is None:
            # Closed, or half-open and waiting for a probe: fetch everything
            # that may fetch; admit() puts back all but the probe.
            self._pauses.release(Reason.BREAKER)

    def admit(self, batches: Mapping[Partition, list[Record]]) -> dict[Partition, list[Record]]:
        """The part of one poll's batches that may run now; the rest is put back.

        Closed: all of it. Open: none (records fetched before the pause). Half-open:
        the first record only, the probe. A partition put back is rewound
        to its first record not taken and held until the breaker lets it go.
        """
        if self.state is State.CLOSED:
            return dict(batches)
        taken: dict[Partition, list[Record]] = {}
        if self.state is State.HALF_OPEN and self._probe is None and batches:
            tp, records = next(iter(batches.items()))
            first = records[0]
            self._probe = first.position
            taken[tp] = [first]
            log.warning(
                "circuit breaker probe: %s[%d]@%d", first.topic, first.partition, first.offset
            )
        for tp, records in batches.items():
            rest = records[len(taken.get(tp, ())) :]
            if rest:
                self._pauses.want(Reason.BREAKER, [tp])
                self._transport.seek(tp, rest[0].offset)
        return taken

    def observe(self, result: BatchResult) -> None:
        """Count what one partition batch did: its failed events, or a success."""
        failed = self._failed(result)
        if self._probe is not None:
            self._judge_probe(result, failed)
            return
        if self._failures <= 0 or self.state is not State.CLOSED:
            return
        if result.applied:
            # A batch that applied events between its failures is no run of
            # failures (a stream with scattered poison events, each
            # dead-lettered among healthy ones, must flow). The batch does
            # not say which of its events came last, so its failures start
            # no run either: the count restarts at the next batch.
            self._failing.clear()
            return
        self._failing.update(failed)
        if len(self._failing) >= self._failures:
            position, why = next(reversed(self._failing.items()))
            self._open(
                f"circuit breaker open: the handler failed for {len(self._failing)} events in "
                f"a row, the last {_where(position)} ({why})"
            )

    def forget(self, tp: Partition) -> None:
        """``tp`` is no longer this member's (its hold went with it, in the ledger).

        A probe on ``tp`` whose result the member will never see (the
        partition went while it ran) is forgotten, so the next poll brings
        another.
        """
        if self._probe is not None and self._probe[:2] == tp:
            self._probe = None

    def _judge_probe(self, result: BatchResult, failed: dict[Position, str]) -> None:
        probe, self._probe = self._probe, None
        assert probe is not None
        if result.applied:
            self.state = State.CLOSED
            self._failing.clear()
            log.warning(
                "circuit breaker closed: the probe %s was applied; resuming %d partition(s)",
                _where(probe),
                len(self.held),
            )
        elif failed:
            why = next(iter(failed.values()))
            self._open(f"circuit breaker open again: the probe {_where(probe)} failed ({why})")
        # Anything else (an outage, a duplicate, an invalid id): no verdict
        # on the handler; the next poll brings another probe.

    def _open(self, why: str) -> None:
        self.state = State.OPEN
        self._until = self._clock() + self._pause
        log.error(
            "%s. Pausing every partition for %.1fs (still polling, so this member stays in the "
            "group), then trying one event: nothing is dead-lettered meanwhile. A handler that "
            "fails for every event is usually a bad deploy or a dependency that is down; once it "
            "works again the worker goes on by itself (--breaker-failures, --breaker-pause)",
            why,
            self._pause,
        )

    def _failed(self, result: BatchResult) -> dict[Position, str]:
        """The events of ``result`` whose handler failed, in offset order, and why."""
        found: dict[Position, str] = {}
        for letter in result.letters:
            if letter.reason in _FAILED_LETTERS:
                record = letter.record
                found[record.position] = describe(letter.error)
        failure = result.failure
        if failure is not None and failure.kind == "handler" and failure.event is not None:
            found[failure.position] = describe(failure.error)
        return found


def _where(position: Position) -> str:
    topic, partition, offset = position
    return f"{topic}[{partition}]@{offset}"
