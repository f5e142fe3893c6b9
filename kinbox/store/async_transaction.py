"""One inbox transaction on an ``AsyncConnection``, and a program run in it on the loop.

The async twin of :mod:`kinbox.store.postgres`'s transaction and of
:func:`kinbox.core.inbox.drive`: the same statements
(:mod:`kinbox.store.transaction`), savepoints and judgements, each step
awaited on the loop that owns the connection, async handlers' calls too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar, cast

import psycopg

from kinbox.core import steps
from kinbox.core.errors import ConflictError, StoreError
from kinbox.core.event import Event
from kinbox.core.parking import KeyState
from kinbox.core.reuse import Sighting
from kinbox.store import transaction as shared
from kinbox.store.cursors import forget, refused
from kinbox.store.errors import translate
from kinbox.store.statements import CHECK_DEFERRED, InboxStatements

T = TypeVar("T")
R = TypeVar("R")

_Pipe = tuple[
    AbstractAsyncContextManager[Callable[[], Awaitable[bool]]], Callable[[], Awaitable[bool]]
]


async def drive_async(program: steps.Program[T], tx: AsyncTransaction) -> T:
    """Run ``program`` in ``tx``, each step awaited on the running loop; return its result.

    What the program raises passes through; a pipelined block it left open
    is closed first.
    """
    stepper = steps.Stepper(program(tx))
    pipes: list[_Pipe] = []
    try:
        while (step := stepper.next()) is not None:
            try:
                stepper.answer(await _step(step, tx, pipes))
            except BaseException as exc:
                stepper.fail(exc)
    except BaseException as exc:
        while pipes:
            await pipes.pop()[0].__aexit__(type(exc), exc, exc.__traceback__)
        raise
    return stepper.result


async def _step(step: steps.Step, tx: AsyncTransaction, pipes: list[_Pipe]) -> Any:
    """Do one step in ``tx``."""
    if isinstance(step, steps.Call):
        return await (tx.savepoint(step) if step.guard == "savepoint" else tx.unguarded(step))
    if isinstance(step, steps.SyncPipeline):
        return await pipes[-1][1]()
    if isinstance(step, steps.Claim):
        return await tx.claim(step.events, step.reclaim)
    if isinstance(step, steps.CheckReused):
        return await tx.reused(step.events)
    if isinstance(step, steps.DeadLetterRow):
        return await tx.dead_letter(step.event, step.reason)
    if isinstance(step, steps.ParkingState):
        return await tx.parking_state(step.topic, step.keys)
    if isinstance(step, steps.Park):
        return await tx.park(step)
    if isinstance(step, steps.CheckDeferred):
        return await tx.check_deferred()
    if isinstance(step, steps.OpenPipeline):
        block = tx.pipelined()
        pipes.append((block, await block.__aenter__()))
        return None
    closing = pipes.pop()[0]
    if step.error is None:
        await closing.__aexit__(None, None, None)
    elif not await closing.__aexit__(type(step.error), step.error, step.error.__traceback__):
        raise step.error
    return None


class AsyncTransaction:
    """One inbox transaction on an ``AsyncConnection``: the sync store's, awaited.

    Programs see it (:class:`~kinbox.core.steps.Seen`): its connection, and
    its judgement of what a handler raised.
    """

    __slots__ = ("_claimed", "_conn", "_consumer", "_sql")

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], consumer: str, sql: InboxStatements
    ) -> None:
        self._conn = conn
        self._consumer = consumer
        self._sql = sql
        self._claimed: shared.ClaimPlan | None = None  # what reused() need not ask again

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        """What async handlers receive as ``tx``."""
        return self._conn

    async def claim(self, events: Sequence[Event], reclaim: Collection[str]) -> list[Event]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.claim`."""
        plan = self._claimed = shared.ClaimPlan(self._sql, self._consumer, events, reclaim)
        return await self._planned(plan)

    async def reused(self, events: Sequence[Event]) -> list[Sighting]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.reused`."""
        found, rest = shared.reuses_left(self._claimed, events)
        if rest:
            found += await self._planned(shared.ReusedPlan(self._sql, self._consumer, rest))
        return shared.in_order(found, events)

    async def parking_state(self, topic: str, keys: Collection[bytes]) -> dict[bytes, KeyState]:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.parking_state`."""
        plan = shared.ParkingStatePlan(self._sql, self._consumer, topic, keys)
        return await self._planned(plan)

    async def park(self, step: steps.Park) -> None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.park`."""
        await self._planned(shared.ParkPlan(self._sql, self._consumer, step, self._conn.info))

    async def _planned(self, plan: shared.Plan[R]) -> R:
        """Run ``plan``'s statements in order; its result."""
        for statement, params in plan.statements:
            try:
                plan.take(await (await self._conn.execute(statement, params)).fetchall())
            except psycopg.Error as exc:
                raise translate(exc, self._conn) from exc
            except ValueError as exc:
                raise shared.unsendable(exc) from exc
        return plan.result()

    async def dead_letter(self, event: Event, reason: str) -> None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.dead_letter`."""
        statement = shared.dead_letter(self._sql, self._consumer, event, reason, self._conn.info)
        try:
            await self._conn.execute(*statement)
        except psycopg.Error as exc:
            raise translate(exc, self._conn) from exc
        except ValueError as exc:
            raise shared.unsendable(exc) from exc

    async def check_deferred(self) -> None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.check_deferred`."""
        try:
            await self._conn.execute(CHECK_DEFERRED)
        except psycopg.Error as exc:
            raise translate(exc, self._conn, own=False) from exc

    async def savepoint(self, call: steps.Call) -> object:
        """``call`` in a savepoint of its own (see the sync store's ``savepoint``)."""
        try:
            async with self._conn.transaction():
                result = await _called(call, self._conn)
                # Raising inside the block rolls back to the savepoint, where
                # a RELEASE would fail and leave the whole transaction aborted.
                shared.raise_if_aborted(self._conn)
                return result
        except psycopg.Error as exc:
            raise translate(exc, self._conn, own=False) from exc

    async def unguarded(self, call: steps.Call) -> object:
        """``call`` without a savepoint (see the sync store's ``unguarded``)."""
        try:
            result = await _called(call, self._conn)
        except psycopg.Error as exc:
            raise translate(exc, self._conn, own=False) from exc
        # Without a savepoint, the next handler's first statement would fail
        # and take the blame.
        shared.raise_if_aborted(self._conn)
        return result

    @asynccontextmanager
    async def pipelined(self) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
        """A pipelined block (see the sync store's ``pipelined``)."""
        conn = self._conn
        forget(conn)
        try:
            async with conn.pipeline() as pipeline:

                async def sync() -> bool:
                    try:
                        await pipeline.sync()
                    except psycopg.Error:
                        return False
                    return not shared.aborted(conn) and not refused(conn)

                yield sync
        except psycopg.Error as exc:
            raise translate(exc, conn, own=False) from exc
        finally:
            was_refused = refused(conn)
            forget(conn)
        shared.after_pipeline(conn, was_refused)

    def outage(self, exc: BaseException) -> StoreError | None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.outage`."""
        return shared.outage(exc, self._conn)

    def conflict(self, exc: BaseException) -> ConflictError | None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.conflict`."""
        return shared.conflict(exc, self._conn)


async def _called(call: steps.Call, conn: psycopg.AsyncConnection[Any]) -> object:
    """What ``call`` returns, awaited if it awaits."""
    result = call.run(conn)
    return await cast(Awaitable[object], result) if call.awaits else result
