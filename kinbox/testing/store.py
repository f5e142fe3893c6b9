"""An in-memory :class:`~kinbox.core.inbox.InboxStore`: :class:`FakeStore` and its ``tx``.

It keeps what PostgreSQL would keep in ``processed_events`` (a status and a
reason per claimed id), the reused ids it was shown (``reused_event_ids``)
and what handlers write (:attr:`FakeStore.effects`),
with the transaction semantics the batch processor relies on: a transaction
that raises forgets its claims and effects, a savepoint that raises forgets
only its own effects, and a database error leaves the transaction aborted
until a savepoint rolls it back. Its knobs make it fail the way the real store
does, so tests can drive the failure paths without a server. The contract
suite (``tests/contract``) runs the same tests over it and the real store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import psycopg

from kinbox.core.describe import storable
from kinbox.core.errors import ConflictError, StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import drive, first_occurrences
from kinbox.core.parking import KeyState, Parked
from kinbox.core.reuse import Sighting, payload_digest
from kinbox.core.steps import Park, Program
from kinbox.store.errors import aborted_at_commit, behind, left_aborted, translate
from kinbox.testing.awaiting import AwaitsAlone

T = TypeVar("T")


def _aborted() -> StoreError:
    """What PostgreSQL says to a statement in an aborted transaction."""
    return StoreError(
        "InFailedSqlTransaction: current transaction is aborted, commands ignored until end "
        "of transaction block",
        transient=False,
    )


def postgres_accepts(text: str) -> bool:
    """Whether a UTF8 PostgreSQL, through psycopg, takes ``text`` in a text column as it is.

    It does not when ``text`` holds NUL (psycopg refuses it) or a lone
    surrogate (it cannot be encoded as UTF-8).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


class FakeConn:
    """What handlers get as ``tx`` from the fake store: a list of effects, and an aborted flag.

    A handler "writes" by appending to :attr:`effects`; what a transaction (or
    a savepoint) appended goes when it rolls back. A handler simulates a
    statement the database refuses with :meth:`fail`, and the connection
    going away under it with :meth:`lose`.
    """

    def __init__(self, effects: list[Any]) -> None:
        self.effects = effects
        """The store's effects, shared: append to write one."""
        self.aborted = False
        """A statement failed and no savepoint has rolled back since (PostgreSQL's
        "current transaction is aborted"): kinbox's statements fail until then."""
        self.broken = False
        """The connection was lost (psycopg's ``broken``): an outage, whatever is raised."""

    def fail(self, exc: psycopg.Error) -> NoReturn:
        """Raise ``exc`` as a refused statement would, leaving the transaction aborted."""
        self.aborted = True
        raise exc

    def lose(self, exc: psycopg.Error | None = None) -> NoReturn:
        """Raise ``exc`` as a statement whose connection went away would; the rest fail too."""
        self.aborted = self.broken = True
        raise exc or psycopg.OperationalError("server closed the connection unexpectedly")


class FakeTransaction(AwaitsAlone):
    """One open transaction of :class:`FakeStore` (an ``InboxTransaction``)."""

    def __init__(self, store: FakeStore, mark: int) -> None:
        self._store = store
        self._mark = mark  # the effects before it are earlier transactions'
        self.connection = FakeConn(store.effects)
        """What handlers receive as ``tx``."""

    def claim(self, events: Sequence[Event], reclaim: Collection[str] = ()) -> list[Event]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.claim`; the store's knobs apply."""
        store = self._store
        store.claims.append([e.id for e in events])
        self._usable()
        if store.fail_claims:
            store.fail_claims -= 1
            raise StoreError("OperationalError: server closed the connection", transient=True)
        # psycopg refuses these before sending anything: the transaction stays usable.
        unsendable = [e.id for e in events if not postgres_accepts(e.id)]
        if unsendable:
            raise StoreError(f"DataError: cannot send event id {unsendable[0]!r}", transient=False)
        refused = [e.id for e in events if store.refuse_id(e.id)]
        if refused:
            self.connection.aborted = True  # the server refused the statement
            raise StoreError(f"DataError: cannot store event id {refused[0]!r}", transient=False)
        fresh = []
        for event in first_occurrences(events):
            taken_over = event.id in reclaim and store.status.get(event.id) in (
                "dead_lettered",
                "parked",
            )
            if event.id not in store.claimed or taken_over:
                store.claimed[event.id] = event
                store.status[event.id] = "applied"
                store.reasons.pop(event.id, None)
                fresh.append(event)
        return fresh

    def reused(self, events: Sequence[Event]) -> list[Sighting]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.reused`: recorded in ``sightings``."""
        store = self._store
        self._usable()
        found = []
        for event in events:
            row = store.claimed.get(event.id)
            position = event.position
            if row is None or (event.id, *position) in store.sightings:
                continue
            if payload_digest(row.value) != payload_digest(event.value):
                sighting = Sighting(event, row.topic, row.partition, row.offset)
                store.sightings[(event.id, *position)] = sighting
                found.append(sighting)
        return found

    def dead_letter(self, event: Event, reason: str) -> None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.dead_letter`.

        ``reason`` is escaped and bounded as the real store does
        (:func:`kinbox.core.describe.storable`); ``refuse_reason`` sees it first.
        """
        assert event.id in self._store.claimed, f"dead_letter of unclaimed {event.id!r}"
        self._usable()
        if self._store.refuse_reason(reason):
            self.connection.aborted = True
            raise StoreError(f"DataError: cannot store reason {reason[:40]!r}", transient=False)
        self._store.status[event.id] = "dead_lettered"
        self._store.reasons[event.id] = storable(reason, "UTF8")

    def parking_state(self, topic: str, keys: Collection[bytes]) -> dict[bytes, KeyState]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.parking_state`."""
        self._usable()
        store = self._store
        found = {}
        for key in keys:
            row = store.parked_keys.get((topic, key))
            if row is not None:
                mine = [
                    (i, free) for i, (t, p, free, _) in store.parked_events.items()
                    if t == topic and p.key == key
                ]  # fmt: skip
                released = frozenset(i for i, free in mine if free)
                found[key] = KeyState(row[0], row[1], released, len(mine) - len(released))
        return found

    def park(self, step: Park) -> None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.park`."""
        self._usable()
        store, topic = self._store, step.topic
        for parked in step.parked:
            seq = store.parked_events.get(parked.event_id, (None, None, None, 0))[3]
            store.parked_events[parked.event_id] = (topic, parked, False, seq or store.next_seq())
            store.status[parked.event_id] = "parked"
            store.reasons[parked.event_id] = f"parked: key waits behind {parked.blocked_by}"
        for key, by in step.blocked:
            store.parked_keys[(topic, key)] = (by, False)
        for event_id in step.unparked:
            store.parked_events.pop(event_id, None)
        for key in step.freed:
            row = store.parked_keys.get((topic, key))
            left = any(t == topic and p.key == key for t, p, _, _ in store.parked_events.values())
            if row is not None and not left:
                del store.parked_keys[(topic, key)]

    def check_deferred(self) -> None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.check_deferred` (``refuse_commit``)."""
        self._usable()
        try:
            self._store.check_deferred(self._mark)
        except StoreError:
            self.connection.aborted = True
            raise

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.savepoint`."""
        self._usable()
        self._store.savepoints += 1
        mark = len(self._store.effects)
        try:
            yield
        except psycopg.Error as exc:
            self._roll_back_to(mark)
            raise translate(exc, self.connection, own=False) from exc
        except BaseException:
            self._roll_back_to(mark)
            raise
        if self.connection.aborted:
            # As the real store does: roll back to the savepoint, blame this block.
            self._roll_back_to(mark)
            raise left_aborted()

    @contextmanager
    def unguarded(self) -> Iterator[None]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.unguarded`."""
        # Nothing to undo here: a failure rolls the whole transaction back.
        try:
            yield
        except psycopg.Error as exc:
            raise translate(exc, self.connection, own=False) from exc
        if self.connection.aborted:
            raise left_aborted()

    @contextmanager
    def pipelined(self) -> Iterator[Callable[[], bool]]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.pipelined`.

        Statements here run at once, so errors are raised where they happen;
        :attr:`FakeStore.pipelined` counts the blocks.
        """
        self._store.pipelined += 1
        with self.unguarded():
            yield lambda: not self.connection.aborted

    def outage(self, exc: BaseException) -> StoreError | None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.outage` (the real store's rule)."""
        found = behind(exc, self.connection)
        return None if isinstance(found, ConflictError) else found

    def conflict(self, exc: BaseException) -> ConflictError | None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.conflict` (the real store's rule)."""
        found = behind(exc, self.connection)
        return found if isinstance(found, ConflictError) else None

    def _usable(self) -> None:
        if self.connection.broken:
            raise StoreError("OperationalError: the connection is lost", transient=True)
        if self.connection.aborted:
            raise _aborted()

    def _roll_back_to(self, mark: int) -> None:
        del self._store.effects[mark:]
        self.connection.aborted = False


class FakeStore:
    """An :class:`~kinbox.core.inbox.InboxStore` in memory, for one consumer.

    State, readable by tests: :attr:`status` and :attr:`reasons` (the
    ``processed_events`` rows), :attr:`claimed`, :attr:`sightings` (reused ids),
    :attr:`effects` (what handlers appended to ``tx.effects``, committed ones only once the
    transaction is over), and counters (:attr:`transactions`, :attr:`commits`,
    :attr:`savepoints`, :attr:`pipelined`, :attr:`claims`, :attr:`refused_commits`).

    Knobs, to fail the way PostgreSQL does:

    - ``fail_claims``: that many next claims raise a *transient*
      :class:`~kinbox.core.errors.StoreError` (the connection went away).
    - ``fail_skims``: that many next :meth:`known` look-ups raise a
      transient :class:`~kinbox.core.errors.StoreError`.
    - ``lose_after_commit``: that many next transactions commit and then
      raise a transient error: the ambiguous commit, where the client never
      heard back from a COMMIT that happened.
    - ``refuse_id(id)``, ``refuse_reason(reason)``: the database refuses
      this id in a claim, or this reason in the dead-letter bookkeeping, with
      a non-transient error that aborts the transaction. (Ids that psycopg
      cannot send at all, with NUL or a lone surrogate, are always refused,
      and leave the transaction usable, as psycopg does.)
    - ``refuse_commit(effects)``: COMMIT (and ``check_deferred``) refuses the
      transaction given the effects it wrote: a deferred constraint.

    As the real store, a transaction left aborted (a handler swallowed a
    refused statement, see :meth:`FakeConn.fail`) does not commit: leaving
    its block raises a :class:`~kinbox.core.errors.StoreError`, not transient, and
    everything of it is rolled back. One whose connection was lost
    (:meth:`FakeConn.lose`) raises a transient one.

    Transactions opened from several threads (the runner applies partitions
    side by side) run one at a time: a second one waits for the first to end,
    as if the store had one connection.
    """

    def __init__(self) -> None:
        self.claimed: dict[str, Event] = {}
        """The claimed events by id (the latest claim of a reclaimed one)."""
        self.status: dict[str, str] = {}
        """``applied`` or ``dead_lettered`` by event id."""
        self.reasons: dict[str, str] = {}
        """The dead-letter reason by event id, as stored."""
        self.sightings: dict[tuple[str, str, int, int], Sighting] = {}
        """Deliveries that reused an id with another payload, by (id, topic, partition, offset)."""
        self.effects: list[Any] = []
        """What handlers wrote (``tx.effects.append``) and did not roll back."""
        self.commits = 0
        """Transactions committed."""
        self.savepoints = 0
        """Savepoints opened."""
        self.pipelined = 0
        """Pipelined blocks run (an optimistic pass of a per-event handler)."""
        self.fail_claims = 0
        self.lose_after_commit = 0
        self.closed = False
        self.refuse_id: Callable[[str], bool] = lambda _id: False
        self.refuse_reason: Callable[[str], bool] = lambda _reason: False
        self.refuse_commit: Callable[[list[Any]], bool] = lambda _effects: False
        self.claims: list[list[str]] = []
        """The ids of every claim, in order (refused ones included)."""
        self.refused_commits = 0
        """COMMITs (or deferred checks) refused by ``refuse_commit``."""
        self.transactions = 0
        """Transactions opened."""
        self.skims: list[list[str]] = []
        """The ids of every :meth:`known` look-up, sorted, in order."""
        self.fail_skims = 0
        self.parked_keys: dict[tuple[str, bytes], tuple[str, bool]] = {}
        """Blocked keys: (topic, key) -> (the dead letter's event id, released)."""
        self.parked_events: dict[str, tuple[str, Parked, bool, int]] = {}
        """Parked events by id: (topic, what was parked, released, order parked in)."""
        self._seq = 0
        self._one_at_a_time = threading.RLock()
        # The committed rows while a transaction is open (what known() reads then).
        self._before: dict[str, str] | None = None

    def next_seq(self) -> int:
        """The order of the next event parked."""
        self._seq += 1
        return self._seq

    def release(self, topic: str, key: bytes) -> list[Parked]:
        """Release ``key`` as ``kinbox dlq release`` does; return its parked events, in order.

        Deliver them again with :func:`~kinbox.core.letter.replay_headers` to
        apply them.
        """
        with self._one_at_a_time:
            by, _ = self.parked_keys[(topic, key)]
            self.parked_keys[(topic, key)] = (by, True)
            mine = sorted(
                (seq, i) for i, (t, p, _, seq) in self.parked_events.items()
                if t == topic and p.key == key
            )  # fmt: skip
            for seq, event_id in mine:
                t, parked, _, _ = self.parked_events[event_id]
                self.parked_events[event_id] = (t, parked, True, seq)
            return [self.parked_events[i][1] for _, i in mine]

    def check_deferred(self, mark: int) -> None:
        """Run ``refuse_commit`` on the effects written since ``mark``.

        Raises:
            StoreError: not transient, when it refuses them.
        """
        if self.refuse_commit(self.effects[mark:]):
            self.refused_commits += 1
            raise StoreError("UniqueViolation: duplicate key (deferred)", transient=False)

    @contextmanager
    def transaction(self) -> Iterator[FakeTransaction]:
        """See :meth:`~kinbox.core.inbox.InboxStore.transaction`; the knobs apply."""
        with self._one_at_a_time:
            yield from self._transaction()

    def _transaction(self) -> Iterator[FakeTransaction]:
        self.transactions += 1
        saved = dict(self.claimed), dict(self.status), dict(self.reasons), len(self.effects)
        sightings = dict(self.sightings)
        parking = dict(self.parked_keys), dict(self.parked_events)
        tx = FakeTransaction(self, saved[3])
        self._before = saved[1]
        try:
            yield tx
            if tx.connection.broken:
                raise StoreError("OperationalError: the connection is lost", transient=True)
            if tx.connection.aborted:
                raise aborted_at_commit()
            self.check_deferred(saved[3])
        except BaseException:
            self.claimed, self.status, self.reasons = saved[0], saved[1], saved[2]
            self.sightings = sightings
            self.parked_keys, self.parked_events = parking
            del self.effects[saved[3] :]
            raise
        finally:
            self._before = None
        self.commits += 1
        if self.lose_after_commit:
            self.lose_after_commit -= 1
            raise StoreError("OperationalError: connection lost during COMMIT", transient=True)

    def run(self, program: Program[T]) -> T:
        """See :meth:`~kinbox.core.inbox.InboxStore.run`: in a :meth:`transaction`, knobs too."""
        with self.transaction() as tx:
            return drive(program, tx, tx.wait)

    def known(self, events: Sequence[Event]) -> set[str]:
        """See :meth:`~kinbox.core.inbox.InboxStore.known`: committed rows of the same payloads.

        Never waits: while a transaction is open it reads the rows as they
        were before it began, so its claims are never seen uncommitted. The
        knobs apply as to a claim's ids: ``fail_skims`` and ``refuse_id``.
        """
        ids = [e.id for e in events]
        self.skims.append(sorted(ids))
        if self.fail_skims:
            self.fail_skims -= 1
            raise StoreError("OperationalError: server closed the connection", transient=True)
        refused = [i for i in ids if not postgres_accepts(i) or self.refuse_id(i)]
        if refused:
            raise StoreError(f"DataError: cannot send event id {refused[0]!r}", transient=False)
        rows = self.status if self._before is None else self._before
        return {e.id for e in events if e.id in rows and _same(self.claimed[e.id], e)}

    def for_async(self) -> FakeStore:
        """Itself: its transactions also run async handlers (:meth:`FakeTransaction.wait`)."""
        return self

    def close(self) -> None:
        """Mark the store closed."""
        self.closed = True


def _same(first: Event, again: Event) -> bool:
    """Whether ``again`` carries the payload of the record that claimed its id, ``first``.

    As the real store judges it: by the payloads' digests.
    """
    return payload_digest(first.value) == payload_digest(again.value)
