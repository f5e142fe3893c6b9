"""The inbox store: the only module that talks to PostgreSQL for the inbox.

:class:`InboxStore` is the seam the runner depends on (a fake implements it
in the unit tests); :class:`PostgresInboxStore` is the real one, on a
``psycopg_pool`` pool (for async handlers, the same statements on an async
pool: :mod:`kinbox.store.awaiting`). Every psycopg error leaving this module is
translated (:mod:`kinbox.store.errors`) to :class:`~kinbox.core.errors.StoreError` with
``transient`` set when trying again may succeed. What kinbox writes here
that comes from a record or an exception (a reason) is made storable first:
NUL and lone surrogates escaped (:func:`kinbox.core.describe.clean`), and every
non-ASCII character escaped when the database's encoding is not UTF8.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from kinbox.core.describe import describe
from kinbox.core.errors import ConflictError, SchemaError, StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import InboxTransaction, Invoke, drive
from kinbox.core.names import sql_identifier
from kinbox.core.parking import KeyState
from kinbox.core.reuse import Sighting
from kinbox.core.steps import Park, Program
from kinbox.store import migrations
from kinbox.store.checkout import Checkout
from kinbox.store.cursors import configure, forget, refused
from kinbox.store.errors import aborted_at_commit, translate
from kinbox.store.schema import INBOX
from kinbox.store.statements import CHECK_DEFERRED, InboxStatements
from kinbox.store.transaction import (
    ClaimPlan,
    ParkingStatePlan,
    ParkPlan,
    Plan,
    ReusedPlan,
    aborted,
    after_pipeline,
    conflict,
    dead_letter,
    in_order,
    known_params,
    outage,
    raise_if_aborted,
    reuses_left,
    unsendable,
)

T = TypeVar("T")
R = TypeVar("R")


class PostgresInboxStore:
    """:class:`InboxStore` on PostgreSQL.

    Args:
        conninfo: a libpq URL or ``key=value`` string.
        schema: where ``processed_events`` lives (validated identifier).
        consumer: the dedup scope, the Kafka consumer group id.
        pool_size: connections held: the runner applies that many partition
            batches at once, each on its own connection.
    """

    def __init__(self, conninfo: str, *, schema: str, consumer: str, pool_size: int = 2) -> None:
        self._schema = sql_identifier(schema, setting="schema")
        self._consumer = consumer
        # The check turns a connection killed by a server restart into a
        # fresh one instead of a failed batch, mostly without a round trip
        # (kinbox.store.checkout). All connections are opened at once: the
        # runner uses them side by side from its first batches on.
        self._checkout = Checkout()
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            conninfo,
            min_size=max(1, pool_size),
            max_size=max(1, pool_size),
            open=False,
            check=self._checkout.check,
            configure=configure,
            name="kinbox-inbox",
        )
        self._sql = InboxStatements.of(self._schema)

    def open(self, timeout: float = 30.0) -> None:
        """Open the pool and check that ``kinbox migrate`` has run.

        Raises:
            SchemaError: the inbox tables are missing or too old (says what to run).
            StoreError: the database cannot be reached within ``timeout``.
        """
        try:
            self._pool.open(wait=True, timeout=timeout)
            with self._pool.connection() as conn:
                migrations.check(conn, self._schema, INBOX)
                self._checkout.given_back(conn)
        except SchemaError:
            raise
        except (psycopg.Error, TimeoutError) as exc:  # PoolTimeout is an OperationalError
            raise translate(exc) from exc

    @contextmanager
    def transaction(self) -> Iterator[InboxTransaction]:
        """See :meth:`InboxStore.transaction`."""
        held: psycopg.Connection[Any] | None = None  # none yet: taking one failed
        try:
            with self._pool.connection() as conn:
                held = conn
                try:
                    with conn.transaction():
                        yield _PostgresTransaction(conn, self._consumer, self)
                        # psycopg would send COMMIT, PostgreSQL would answer
                        # ROLLBACK, and nothing would be raised: the batch
                        # would count as committed.
                        if aborted(conn):
                            raise aborted_at_commit()
                finally:
                    self._checkout.given_back(conn)
        except psycopg.Error as exc:
            # What gets here untranslated comes from taking a connection,
            # BEGIN, COMMIT or ROLLBACK: COMMIT runs the handlers' deferred
            # checks, so it is judged as their statements are.
            raise translate(exc, held, own=False) from exc

    def run(self, program: Program[T]) -> T:
        """See :meth:`InboxStore.run`: each step on the calling thread."""
        with self.transaction() as tx:
            return drive(program, tx)

    def known(self, events: Sequence[Event]) -> set[str]:
        """See :meth:`InboxStore.known`: one statement, in autocommit, on a pool connection."""
        if not events:
            return set()
        try:
            with self._pool.connection() as conn:
                try:
                    # Autocommit: the statement is its own transaction, so the
                    # look-up costs one round trip, not BEGIN, SELECT and COMMIT.
                    conn.autocommit = True
                    # Planned for each call (never a cached generic plan): the
                    # plan then follows the table's size as it grows.
                    try:
                        rows = conn.execute(
                            self._sql.known, known_params(self._consumer, events), prepare=False
                        ).fetchall()
                    except psycopg.Error as exc:
                        raise translate(exc, conn) from exc
                finally:
                    if not conn.closed:
                        conn.autocommit = False
                    self._checkout.given_back(conn)
        except psycopg.Error as exc:  # taking a connection, or setting autocommit
            raise translate(exc) from exc
        except ValueError as exc:  # an id the client encoding cannot encode
            raise StoreError(describe(exc), transient=False) from exc
        return {row[0] for row in rows}

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        """See :meth:`~kinbox.core.inbox.SessionCapable.sessions`: :mod:`kinbox.store.orm`'s."""
        from kinbox.store.orm import Sessions  # loaded only for handlers that ask for one

        return Sessions(session_class).around


class _PostgresTransaction:
    """:class:`~kinbox.core.inbox.InboxTransaction` on a psycopg ``Connection``."""

    def __init__(
        self, conn: psycopg.Connection[Any], consumer: str, store: PostgresInboxStore
    ) -> None:
        self._conn = conn
        self._consumer = consumer
        self._store = store
        self._unguarded = _Unguarded(conn)
        self._claimed: ClaimPlan | None = None  # what reused() need not ask again

    @property
    def connection(self) -> Any:
        return self._conn

    def claim(self, events: Sequence[Event], reclaim: Collection[str] = ()) -> list[Event]:
        plan = self._claimed = ClaimPlan(self._store._sql, self._consumer, events, reclaim)
        return self._planned(plan)

    def reused(self, events: Sequence[Event]) -> list[Sighting]:
        found, rest = reuses_left(self._claimed, events)
        if rest:
            found += self._planned(ReusedPlan(self._store._sql, self._consumer, rest))
        return in_order(found, events)

    def parking_state(self, topic: str, keys: Collection[bytes]) -> dict[bytes, KeyState]:
        return self._planned(ParkingStatePlan(self._store._sql, self._consumer, topic, keys))

    def park(self, step: Park) -> None:
        self._planned(ParkPlan(self._store._sql, self._consumer, step, self._conn.info))

    def _planned(self, plan: Plan[R]) -> R:
        """Run ``plan``'s statements in order; its result."""
        for statement, params in plan.statements:
            try:
                plan.take(self._conn.execute(statement, params).fetchall())
            except psycopg.Error as exc:
                raise translate(exc, self._conn) from exc
            except ValueError as exc:
                # psycopg encodes parameters before sending: an id the client
                # encoding has no code for fails here, as a UnicodeEncodeError.
                raise unsendable(exc) from exc
        return plan.result()

    def dead_letter(self, event: Event, reason: str) -> None:
        statement = dead_letter(self._store._sql, self._consumer, event, reason, self._conn.info)
        try:
            self._conn.execute(*statement)
        except psycopg.Error as exc:
            raise translate(exc, self._conn) from exc
        except ValueError as exc:
            raise unsendable(exc) from exc

    def check_deferred(self) -> None:
        try:
            self._conn.execute(CHECK_DEFERRED)
        except psycopg.Error as exc:
            raise translate(exc, self._conn, own=False) from exc

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        try:
            with self._conn.transaction():
                yield
                # RELEASE would fail here, and psycopg would leave the whole
                # transaction aborted: every later savepoint would fail too, and
                # the next events would be blamed. Raising inside the block makes
                # psycopg roll back to the savepoint instead.
                raise_if_aborted(self._conn)
        except psycopg.Error as exc:
            raise translate(exc, self._conn, own=False) from exc

    def unguarded(self) -> AbstractContextManager[None]:
        # One object per transaction, not a generator per call: the optimistic
        # pass enters it once per event.
        return self._unguarded

    @contextmanager
    def pipelined(self) -> Iterator[Callable[[], bool]]:
        conn = self._conn  # its cursors note a pipeline's refusals (kinbox.store.cursors)
        forget(conn)
        try:
            with conn.pipeline() as pipeline:

                def sync() -> bool:
                    try:
                        pipeline.sync()
                    except psycopg.Error:
                        return False
                    return not aborted(conn) and not refused(conn)

                yield sync
        except psycopg.Error as exc:
            raise translate(exc, conn, own=False) from exc
        finally:
            was_refused = refused(conn)
            forget(conn)
        after_pipeline(conn, was_refused)

    def outage(self, exc: BaseException) -> StoreError | None:
        return outage(exc, self._conn)

    def conflict(self, exc: BaseException) -> ConflictError | None:
        return conflict(exc, self._conn)


class _Unguarded:
    """:meth:`_PostgresTransaction.unguarded`'s block (stateless, so one serves every call)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn  # not the transaction: no reference cycle per batch

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, psycopg.Error):
            raise translate(exc, self._conn, own=False) from exc
        if exc is None:
            # Without a savepoint, the next handler's first statement would
            # fail and take the blame.
            raise_if_aborted(self._conn)


def apply_migrations(
    conninfo: str, schema: str, components: Sequence[migrations.Component]
) -> dict[str, tuple[int, int]]:
    """Run :func:`kinbox.store.migrations.migrate` on a fresh connection (``kinbox migrate``).

    Raises:
        StoreError: the database failed or could not be reached.
    """
    try:
        with psycopg.connect(conninfo, connect_timeout=10) as conn:
            return migrations.migrate(conn, schema, components)
    except psycopg.Error as exc:
        raise translate(exc) from exc
