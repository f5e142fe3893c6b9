"""What the inbox transaction's steps send and how their answers read, without I/O.

The sync transaction (:mod:`kinbox.store.postgres`) and the async one
(:mod:`kinbox.store.awaiting`) each run these over their own connection, so
the two send the same statements with the same parameters and judge the
connection's state the same way; only the waiting differs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.types.numeric import Int8

from kinbox.core.describe import describe, storable
from kinbox.core.errors import ConflictError, StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import first_occurrences
from kinbox.core.parking import KeyState
from kinbox.core.record import Position
from kinbox.core.reuse import Sighting, packed_digests, payload_digest, payload_digests
from kinbox.core.steps import Park
from kinbox.core.traceparent import trace_id
from kinbox.store.arrays import hex_array, int_array, text_array
from kinbox.store.errors import Connection, behind, left_aborted
from kinbox.store.statements import InboxStatements

_INERROR = psycopg.pq.TransactionStatus.INERROR
_PIPELINE_ABORTED = psycopg.pq.PipelineStatus.ABORTED

Statement = tuple[bytes, tuple[Any, ...] | dict[str, Any]]
"""A statement and its parameters (by position, or by name)."""

R_co = TypeVar("R_co", covariant=True)


class Plan(Protocol[R_co]):
    """Statements to run in order, each one's rows taken in, then a result (what a store runs)."""

    statements: list[Statement]

    def take(self, rows: Sequence[Sequence[Any]]) -> None:
        """One statement's rows."""

    def result(self) -> R_co:
        """What the statements' rows say."""


class ClaimPlan:
    """The statements of one claim, which of its events the answers make fresh, which reused.

    One statement per partition of each group (plain, replayed), so topic and
    partition are plain parameters. Duplicates within ``events`` are dropped
    first: the first occurrence of an id wins. The plain claim also records
    the duplicates it found whose payload differs (:attr:`sightings`); those
    it compared are :attr:`compared`, so a later :class:`ReusedPlan` need only
    look at the others (a repeat within the batch, a replayed record).
    """

    __slots__ = ("_by_id", "_events", "_unique", "fresh", "sightings", "statements")

    def __init__(
        self,
        sql: InboxStatements,
        consumer: str,
        events: Sequence[Event],
        reclaim: Collection[str] = (),
    ) -> None:
        self._unique = first_occurrences(events)
        plain = [e for e in self._unique if e.id not in reclaim]
        replayed = [e for e in self._unique if e.id in reclaim]
        self.statements: list[Statement] = [
            *_claims(sql, consumer, plain),
            *((sql.reclaim, params) for params in _by_partition(consumer, replayed)),
        ]
        """What to run, in order; each returns the ids it claimed (:meth:`take`)."""
        self._events = {e.position: e for e in plain}
        self._by_id = {e.id: e for e in plain}
        self.fresh: set[str] = set()
        self.sightings: list[Sighting] = []
        """The reused ids the plain claim recorded."""

    def take(self, rows: Sequence[Sequence[Any]]) -> None:
        """One statement's rows: ids it claimed, and (the plain claim) sightings recorded."""
        for row in rows:
            if len(row) == 1 or row[1] is None:
                self.fresh.add(row[0])
            else:  # ids are unique among the plain events (first occurrences)
                self.sightings.append(Sighting(self._by_id[row[0]], row[2], row[3], row[4]))

    @property
    def compared(self) -> set[Position]:
        """The positions of the plain claim's events it did not claim: compared (or raced)."""
        return {p for p, e in self._events.items() if e.id not in self.fresh}

    def result(self) -> list[Event]:
        """The fresh events, in the order given."""
        return [e for e in self._unique if e.id in self.fresh]


def _claims(sql: InboxStatements, consumer: str, events: Sequence[Event]) -> list[Statement]:
    """The plain claim of each partition of ``events``: of one event, with plain values."""
    if len(events) == 1:
        (event,) = events
        one = {
            "consumer": consumer, "topic": event.topic, "partition": event.partition,
            "ids": event.id, "offsets": Int8(event.offset), "traces": trace_id(event.headers),
            "hashes": Int8(payload_digest(event.value)),
        }  # fmt: skip
        return [(sql.claim_one, one)]
    partitions = _by_partition(consumer, events)
    return [(sql.claim, dict(zip(_NAMES, params, strict=True))) for params in partitions]


_NAMES = ("consumer", "topic", "partition", "ids", "offsets", "traces", "hashes")
"""The plain claim's parameters, in :func:`_by_partition`'s order."""


def known_params(consumer: str, events: Sequence[Event]) -> dict[str, Any]:
    """The look-up's parameters (:attr:`InboxStatements.known`) for ``events``: ids and digests."""
    return {
        "consumer": consumer,
        "ids": text_array([e.id for e in events]),
        "hashes": packed_digests([e.value for e in events]),
    }


def _by_partition(consumer: str, events: Sequence[Event]) -> list[tuple[Any, ...]]:
    return [
        (
            consumer,
            topic,
            partition,
            text_array([e.id for e in group]),
            int_array(e.offset for e in group),
            # Parsed here, never failing: a malformed header stores NULL.
            hex_array(trace_id(e.headers) for e in group),
            # The one digest of each record per claim (kinbox.core.reuse).
            int_array(payload_digests([e.value for e in group])),
        )
        for (topic, partition), group in _partitions(events).items()
    ]


def _partitions(events: Sequence[Event]) -> dict[tuple[str, int], list[Event]]:
    partitions: dict[tuple[str, int], list[Event]] = {}
    for event in events:
        partitions.setdefault((event.topic, event.partition), []).append(event)
    return partitions


def reuses_left(
    claimed: ClaimPlan | None, events: Sequence[Event]
) -> tuple[list[Sighting], list[Event]]:
    """Of ``events`` (duplicates the claim dropped): the sightings the claim recorded, the rest.

    The rest are those the claim did not compare, which a :class:`ReusedPlan`
    must: a repeat within the batch, a replayed record.
    """
    if claimed is None:
        return [], list(events)
    compared = claimed.compared
    asked = {e.position for e in events}
    found = [s for s in claimed.sightings if s.event.position in asked]
    return found, [e for e in events if e.position not in compared]


def in_order(sightings: list[Sighting], events: Sequence[Event]) -> list[Sighting]:
    """``sightings`` in the order of ``events``."""
    order = {e.position: i for i, e in enumerate(events)}
    return sorted(sightings, key=lambda s: order[s.event.position])


class ReusedPlan:
    """The statements that record which of a claim's duplicates reuse an id, one per partition."""

    __slots__ = ("_events", "sightings", "statements")

    def __init__(self, sql: InboxStatements, consumer: str, events: Sequence[Event]) -> None:
        self._events = {e.position: e for e in events}
        self.statements: list[Statement] = [
            (
                sql.reused,
                (
                    topic,
                    partition,
                    text_array([e.id for e in group]),
                    int_array(e.offset for e in group),
                    int_array(payload_digests([e.value for e in group])),
                    consumer,
                ),
            )
            for (topic, partition), group in _partitions(events).items()
        ]
        """What to run, in order; each returns the sightings it recorded (:meth:`take`)."""
        self.sightings: list[Sighting] = []

    def take(self, rows: Sequence[Sequence[Any]]) -> None:
        """One statement's rows: the position of each reuse recorded, and its row's."""
        self.sightings += [
            Sighting(self._events[(topic, partition, offset)], *first)
            for topic, partition, offset, *first in rows
        ]

    def result(self) -> list[Sighting]:
        """The sightings recorded, in the order of the events given."""
        order = {position: i for i, position in enumerate(self._events)}
        return sorted(self.sightings, key=lambda s: order[s.event.position])


class ParkingStatePlan:
    """The statements that read which of a topic's keys are blocked, and what was released."""

    __slots__ = ("_blocked", "_released", "_taken", "_unreleased", "statements")

    def __init__(
        self, sql: InboxStatements, consumer: str, topic: str, keys: Collection[bytes]
    ) -> None:
        params = (consumer, topic, sorted(keys))
        self.statements: list[Statement] = [(sql.blocked, params), (sql.released, params)]
        """The blocked keys (locked), then their released events."""
        self._taken = 0
        self._blocked: dict[bytes, tuple[str, bool]] = {}
        self._released: dict[bytes, set[str]] = {}
        self._unreleased: dict[bytes, int] = {}

    def take(self, rows: Sequence[Sequence[Any]]) -> None:
        """The blocked keys' rows first, then the released events'."""
        if self._taken == 0:
            self._blocked = {bytes(key): (by, released) for key, by, released in rows}
        else:
            for key, event_id, released in rows:
                if released:
                    self._released.setdefault(bytes(key), set()).add(event_id)
                else:
                    self._unreleased[bytes(key)] = self._unreleased.get(bytes(key), 0) + 1
        self._taken += 1

    def result(self) -> dict[bytes, KeyState]:
        """Each blocked key's state."""
        return {
            key: KeyState(
                by, released, frozenset(self._released.get(key, ())), self._unreleased.get(key, 0)
            )
            for key, (by, released) in self._blocked.items()
        }


class ParkPlan:
    """The statements of one :class:`~kinbox.core.steps.Park` step, in the order they must run.

    Parked records first, then their rows' status, the keys blocked, the
    released records that ran, and last the keys freed (which the earlier
    statements may have kept blocked).
    """

    __slots__ = ("statements",)

    def __init__(
        self, sql: InboxStatements, consumer: str, step: Park, info: psycopg.ConnectionInfo
    ) -> None:
        topic = step.topic
        statements: list[Statement] = []
        for p in step.parked:
            statements.append((sql.park, (
                consumer, topic, p.event_id, p.key, p.partition, p.offset, p.value,
                [name for name, _ in p.headers], [value for _, value in p.headers],
                p.timestamp, p.blocked_by,
            )))  # fmt: skip
            reason = storable(f"parked: key waits behind {p.blocked_by}", _encoding(info))
            statements.append((sql.parked, (reason, consumer, p.event_id)))
        statements += [(sql.block, (consumer, topic, key, by)) for key, by in step.blocked]
        if step.unparked:
            statements.append((sql.unpark, (consumer, list(step.unparked))))
        if step.freed:
            statements.append((sql.free, (consumer, topic, sorted(step.freed))))
        self.statements = statements
        """What to run, in order."""

    def take(self, rows: Sequence[Sequence[Any]]) -> None:
        """Nothing is read back."""

    def result(self) -> None:
        """Nothing to say."""


def _encoding(info: psycopg.ConnectionInfo) -> str:
    return info.parameter_status("server_encoding") or "UTF8"


def dead_letter(
    sql: InboxStatements, consumer: str, event: Event, reason: str, info: psycopg.ConnectionInfo
) -> Statement:
    """The statement that dead-letters ``event``'s row, ``reason`` made storable there."""
    text = storable(reason, info.parameter_status("server_encoding"))
    return sql.dead_letter, (text, consumer, event.id)


def unsendable(exc: ValueError) -> StoreError:
    """Psycopg could not encode a parameter (an id the client encoding has no code for)."""
    return StoreError(describe(exc), transient=False)


def aborted(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn``'s transaction is aborted (a statement in it failed).

    In pipeline mode the transaction's status reads active until the
    pipeline is synced, but the pipeline's own says aborted as soon as a
    failed statement's result has been read (a handler's fetch did).
    """
    # libpq tracks both locally: no round trip (and through pgconn, not
    # conn.info, which builds an object per call: this runs per event).
    pgconn = conn.pgconn
    return pgconn.transaction_status == _INERROR or pgconn.pipeline_status == _PIPELINE_ABORTED


def raise_if_aborted(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Blame the handler that returned normally but left the transaction aborted."""
    if aborted(conn):
        raise left_aborted()


def after_pipeline(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], was_refused: bool
) -> None:
    """Judge a pipelined block that ended normally.

    Raises:
        StoreError: the block left the transaction aborted, or the pipeline
            refused a call that a handler then caught (one that raised it
            failed the pass already).
    """
    raise_if_aborted(conn)
    if was_refused:
        raise StoreError(
            "NotSupportedError: a handler's COPY, stream() or server-side cursor was "
            "refused in pipeline mode",
            transient=False,
        )


def outage(exc: BaseException, conn: Connection) -> StoreError | None:
    """The outage behind what a handler raised on ``conn`` (:meth:`InboxTransaction.outage`)."""
    found = behind(exc, conn)
    return None if isinstance(found, ConflictError) else found


def conflict(exc: BaseException, conn: Connection) -> ConflictError | None:
    """The conflict behind what a handler raised on ``conn`` (:meth:`InboxTransaction.conflict`)."""
    found = behind(exc, conn)
    return found if isinstance(found, ConflictError) else None
