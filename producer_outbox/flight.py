"""Rows in flight: what a lane group has sent and Kafka has not settled yet.

A lane group sends a claim's rows and goes on claiming while their delivery
reports come (:mod:`.group`); no row lock is held meanwhile (:mod:`.claim`).
What keeps each key's order is this bookkeeping, in the group's memory:

- A key with rows in flight is *busy*: the next claims leave the whole key
  out (a keyless row in flight, by its id), so its later rows are claimed only
  once the rows in flight are marked, after the marks' COMMIT: the claim then
  finds them sent, backing off or parked, as if the batch had been one
  transaction.
- A key *settles* when each of its rows in flight has its outcome; its rows
  are then marked together, whatever else their send still waits for. So a
  record waiting on a broker that does not answer (until
  ``message.timeout.ms``) holds back the rows of its own key and nothing else.
- A row that goes alone (:mod:`.batch`) holds its topic's slot on the group's
  second producer; a retried row that finds the slot taken *waits*: it and its
  key stay out of the claims until the slot is free.
- A lane with rows in flight is not given up (:meth:`.LaneOwner.balance`): a
  lane moves to another group or relay only when none of its rows is in flight.
- Each row keeps the *epoch* of the connection that held its lane's lock when
  it was claimed. Should that connection die, the lock went with it, and
  another relay may take the lane and publish the row too (at least once, and
  per key in order: each publisher sends the key's rows in order, from its
  first unsent one). The row's acknowledgement is still marked (it is in
  Kafka); its failure is not: the lane's new owner decides about the row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kinbox.core.publisher import Outcome, Sending
from producer_outbox.records import OutboxRow

_Unit = tuple[str | None, str | None]
"""What settles as a whole: ``(key, None)``, or ``(None, id)`` for a keyless row."""


def _unit(row: OutboxRow) -> _Unit:
    return (row.key, None) if row.key is not None else (None, row.id)


@dataclass(eq=False)
class Flight:
    """The rows of one send, their :class:`Sending`, and how they were sent."""

    rows: Sequence[OutboxRow]
    sending: Sending
    epoch: int
    """The connection (of the group's) that held the rows' lanes when they were claimed."""
    started: float
    """When they were sent (``time.monotonic()``)."""
    spans: Mapping[int, Any] = field(default_factory=dict)
    """Telemetry's span of a row, by its index (:mod:`.telemetry`)."""
    alone: bool = False
    """A retried row on the second producer, holding its topic's slot there."""
    left: dict[_Unit, int] = field(default_factory=dict)
    """Key (or keyless row) -> its rows here whose outcome was not taken yet."""
    members: dict[_Unit, list[int]] = field(default_factory=dict)
    """Key (or keyless row) -> the indexes of its rows here."""
    released: int = 0

    def reported(self, skip_topics: Collection[str] = ()) -> bool:
        """Whether every row, but those of ``skip_topics``, has its outcome."""
        return all(
            outcome is not None or row.topic in skip_topics
            for row, outcome in zip(self.rows, self.sending.outcomes, strict=True)
        )


@dataclass(frozen=True)
class Settled:
    """Rows of one flight whose keys have every outcome: marked together, then released."""

    flight: Flight
    indexes: list[int]
    """In claim order."""

    @property
    def rows(self) -> list[OutboxRow]:
        """The rows, in claim order."""
        return [self.flight.rows[i] for i in self.indexes]

    @property
    def outcomes(self) -> list[Outcome]:
        """Each row's outcome."""
        found: list[Outcome] = []
        for index in self.indexes:
            outcome = self.flight.sending.outcomes[index]
            assert outcome is not None  # a settled row has its outcome
            found.append(outcome)
        return found

    @property
    def spans(self) -> dict[int, Any]:
        """Telemetry's spans, by position in :attr:`rows`."""
        spans = self.flight.spans
        return {n: spans[i] for n, i in enumerate(self.indexes) if i in spans}


class RowsInFlight:
    """A lane group's rows in flight and the keys, lanes and topic slots they hold."""

    def __init__(self) -> None:
        self._flights: list[Flight] = []
        self._keys: Counter[str] = Counter()
        self._ids: set[str] = set()
        self._lanes: Counter[int] = Counter()
        self._alone: dict[str, Flight] = {}
        self._waiting: dict[str, list[OutboxRow]] = {}
        self.rows = 0
        """Rows sent and not yet released."""

    def add(
        self,
        rows: Sequence[OutboxRow],
        sending: Sending,
        *,
        epoch: int,
        started: float,
        spans: Mapping[int, Any] | None = None,
        alone: bool = False,
    ) -> Flight:
        """Hold the keys, lanes (and with ``alone``, the topic slot) of ``rows``, just sent."""
        flight = Flight(rows, sending, epoch, started, spans or {}, alone)
        for index, row in enumerate(rows):
            if row.key is None:
                self._ids.add(row.id)
            else:
                self._keys[row.key] += 1
            unit = _unit(row)
            flight.left[unit] = flight.left.get(unit, 0) + 1
            flight.members.setdefault(unit, []).append(index)
            self._lanes[row.lane] += 1
        if alone:
            self._alone[rows[0].topic] = flight
        self._flights.append(flight)
        self.rows += len(rows)
        return flight

    def wait(self, row: OutboxRow) -> None:
        """Keep retried ``row`` and its key out of the claims until its topic's slot frees."""
        self._waiting.setdefault(row.topic, []).append(row)

    def busy_keys(self) -> set[str]:
        """Keys the next claim must leave out."""
        waiting = {r.key for rows in self._waiting.values() for r in rows if r.key is not None}
        return set(self._keys) | waiting

    def busy_ids(self) -> set[str]:
        """Keyless rows the next claim must leave out."""
        waiting = {r.id for rows in self._waiting.values() for r in rows if r.key is None}
        return self._ids | waiting

    def lanes(self) -> set[int]:
        """Lanes with rows in flight: not to be given up."""
        return set(self._lanes)

    def alone_topics(self) -> set[str]:
        """Topics whose slot on the second producer is taken."""
        return set(self._alone)

    def count(self, *, but: Collection[str] = ()) -> int:
        """Rows in flight whose key has not settled, but those of the topics ``but``."""
        return sum(
            1
            for flight in self._flights
            for row in flight.rows
            if flight.left[_unit(row)] and row.topic not in but
        )

    def slow_topics(self, sent_before: float) -> set[str]:
        """Topics with a row sent before ``sent_before`` that still has no outcome."""
        return {
            row.topic
            for flight in self._flights
            if flight.started < sent_before
            for row, outcome in zip(flight.rows, flight.sending.outcomes, strict=True)
            if outcome is None
        }

    def take_settled(self) -> list[Settled]:
        """The rows whose keys settled since the last call, per flight (see the module doc)."""
        settled = []
        for flight in self._flights:
            known = flight.sending.known
            if not known:
                continue
            ready: list[int] = []
            for index in known:
                unit = _unit(flight.rows[index])
                flight.left[unit] -= 1
                if flight.left[unit] == 0:
                    ready += flight.members[unit]
            known.clear()
            if ready:
                settled.append(Settled(flight, sorted(ready)))
        return settled

    def release(self, settled: Sequence[Settled]) -> None:
        """Free the keys, lanes and slots of ``settled`` rows (once they are marked)."""
        for part in settled:
            flight = part.flight
            for row in part.rows:
                if row.key is None:
                    self._ids.discard(row.id)
                else:
                    self._keys[row.key] -= 1
                    if not self._keys[row.key]:
                        del self._keys[row.key]
                self._lanes[row.lane] -= 1
                if not self._lanes[row.lane]:
                    del self._lanes[row.lane]
            flight.released += len(part.indexes)
            self.rows -= len(part.indexes)
            if flight.released == len(flight.rows):
                self._flights.remove(flight)
                if flight.alone:
                    topic = flight.rows[0].topic
                    if self._alone.get(topic) is flight:
                        del self._alone[topic]
                        self._waiting.pop(topic, None)
