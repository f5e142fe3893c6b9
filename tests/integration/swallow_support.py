"""Handlers that swallow a database error, generated: each way to swallow in each handler shape.

A *way* runs a statement PostgreSQL refuses, through one part of psycopg's
API, and catches the error — code real teams write, without a savepoint. A
:class:`Case` combines a way with a handler shape: sync or ``async def``, per
event or per batch, writing its effect through the raw connection or through
an ORM session. :func:`register` builds the case's handler on its own topic.

Each topic carries :data:`ROLES` in order: three good events, one whose
handler swallows the error and then carries on (its next statement meets the
aborted transaction), and one whose handler writes its effect, swallows the
error last and returns normally (only kinbox can tell the transaction is
aborted). Whatever the shape, each good event must be applied once, each bad
one dead-lettered, and the partition must move on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from kinbox.app import App
from kinbox.core.event import Event

ROLES = ("good-0", "swallows-then-writes", "good-1", "writes-then-swallows", "good-2")
"""The events of every case's topic, in offset order (ids are ``<case>/<role>``)."""

BAD = ("swallows-then-writes", "writes-then-swallows")


class Base(DeclarativeBase):
    pass


class Effect(Base):
    """The effect table (tests.support.database) as an ORM model, on the schema's search path."""

    __tablename__ = "effects"
    seq: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    consumer: Mapped[str]
    event_id: Mapped[str]
    topic: Mapped[str]
    partition: Mapped[int]
    offset: Mapped[int]
    pid: Mapped[int]


@dataclass(frozen=True)
class Statements:
    """The statements of one schema: the effect, and what PostgreSQL refuses."""

    effect: sql.Composed
    refused_insert: sql.Composed  # a CHECK refuses the value 500
    refused_copy: sql.Composed
    refused_text: str  # the refused insert as plain SQL, for the ORM's text()
    # Division by zero at its second row.
    refused_select = sql.SQL("SELECT 1 / (1 - g) FROM generate_series(0, 3) AS g")

    @classmethod
    def of(cls, schema: str) -> Statements:
        name = sql.Identifier(schema)
        return cls(
            effect=sql.SQL(
                'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
                " VALUES (%s, %s, %s, %s, %s, 0)"
            ).format(name),
            refused_insert=sql.SQL("INSERT INTO {}.checked (a) VALUES (%s) RETURNING a").format(
                name
            ),
            refused_copy=sql.SQL("COPY {}.checked (a) FROM STDIN").format(name),
            refused_text=sql.SQL("INSERT INTO {}.checked (a) VALUES (500)")
            .format(name)
            .as_string(None),
        )


def checked_table(schema: str) -> sql.Composed:
    """The DDL of the table whose CHECK the ways' inserts break."""
    return sql.SQL("CREATE TABLE {}.checked (a int CHECK (a < 100))").format(sql.Identifier(schema))


# The ways, sync. Each catches what psycopg raises, as a handler that "logs and
# carries on" does; none uses a savepoint.


def _fetch(tx: psycopg.Connection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        tx.execute(s.refused_insert, (500,)).fetchone()


def _execute_then_fetch(tx: psycopg.Connection[Any], s: Statements) -> None:
    # Without a pipeline the execute raises; under one, the later fetch does.
    with contextlib.suppress(psycopg.Error):
        tx.execute(s.refused_insert, (500,))
    with contextlib.suppress(psycopg.Error):
        tx.execute("SELECT 1").fetchone()


def _executemany(tx: psycopg.Connection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error), tx.cursor() as cursor:
        cursor.executemany(s.refused_insert, [(1,), (500,), (2,)])


def _iterate(tx: psycopg.Connection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error), tx.cursor() as cursor:
        cursor.execute(s.refused_select)
        for _ in cursor:
            pass


def _stream(tx: psycopg.Connection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error), tx.cursor() as cursor:
        for _ in cursor.stream(s.refused_select):
            pass


def _copy(tx: psycopg.Connection[Any], s: Statements) -> None:
    with (
        contextlib.suppress(psycopg.Error),
        tx.cursor() as cursor,
        cursor.copy(s.refused_copy) as copy,
    ):
        copy.write_row((1,))
        copy.write_row((500,))


# The same ways, async.


async def _afetch(tx: psycopg.AsyncConnection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        await (await tx.execute(s.refused_insert, (500,))).fetchone()


async def _aexecute_then_fetch(tx: psycopg.AsyncConnection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        await tx.execute(s.refused_insert, (500,))
    with contextlib.suppress(psycopg.Error):
        await (await tx.execute("SELECT 1")).fetchone()


async def _aexecutemany(tx: psycopg.AsyncConnection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        async with tx.cursor() as cursor:
            await cursor.executemany(s.refused_insert, [(1,), (500,), (2,)])


async def _aiterate(tx: psycopg.AsyncConnection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        async with tx.cursor() as cursor:
            await cursor.execute(s.refused_select)
            async for _ in cursor:
                pass


async def _astream(tx: psycopg.AsyncConnection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        async with tx.cursor() as cursor:
            async for _ in cursor.stream(s.refused_select):
                pass


async def _acopy(tx: psycopg.AsyncConnection[Any], s: Statements) -> None:
    with contextlib.suppress(psycopg.Error):
        async with tx.cursor() as cursor, cursor.copy(s.refused_copy) as copy:
            await copy.write_row((1,))
            await copy.write_row((500,))


Swallow = Callable[[Any, Statements], None]
AsyncSwallow = Callable[[Any, Statements], Awaitable[None]]


@dataclass(frozen=True)
class Way:
    """One way to swallow a refused statement: its sync and its async form."""

    name: str
    sync: Swallow
    async_: AsyncSwallow


WAYS = (
    Way("fetch", _fetch, _afetch),
    Way("execute-then-fetch", _execute_then_fetch, _aexecute_then_fetch),
    Way("executemany", _executemany, _aexecutemany),
    Way("iterate", _iterate, _aiterate),
    Way("stream", _stream, _astream),
    Way("copy", _copy, _acopy),
)


@dataclass(frozen=True)
class Case:
    """A way to swallow, in one handler shape."""

    way: Way
    asynchronous: bool
    batch: bool
    orm: str | None  # None: raw statements; "tx": the ORM writes, the raw connection swallows;
    # "session": the session swallows too (session.execute inside try)

    @property
    def name(self) -> str:
        parts = [self.way.name, "async" if self.asynchronous else "sync"]
        parts.append("batch" if self.batch else "event")
        if self.orm:
            parts.append(f"orm-{self.orm}")
        return "-".join(parts)


def cases() -> list[Case]:
    """Every way, sync and async, per event and per batch, raw and ORM; and the ORM's own way."""
    out = [
        Case(way, asynchronous, batch, orm)
        for way in WAYS
        for asynchronous in (False, True)
        for batch in (False, True)
        for orm in (None, "tx")
    ]
    session_way = Way("session", _fetch, _afetch)  # the forms are unused: the session swallows
    out += [
        Case(session_way, asynchronous, batch, "session")
        for asynchronous in (False, True)
        for batch in (False, True)
    ]
    return out


def _role(event: Event) -> str:
    return event.id.rpartition("/")[2]


def register(app: App, case: Case, topic: str, group: str, s: Statements, **route: Any) -> None:
    """Register ``case``'s handler for ``topic`` on ``app``."""

    def orm_effect(event: Event) -> Effect:
        return Effect(
            consumer=group, event_id=event.id, topic=event.topic,
            partition=event.partition, offset=event.offset, pid=0,
        )  # fmt: skip

    if not case.asynchronous:

        def one(event: Event, tx: Any, session: Session | None) -> None:
            def effect() -> None:
                if session is None:
                    tx.execute(s.effect, _params(group, event))
                else:
                    session.add(orm_effect(event))
                    session.flush()

            def swallow() -> None:
                if case.orm == "session":
                    assert session is not None
                    with contextlib.suppress(Exception):
                        session.execute(text(s.refused_text))
                else:
                    case.way.sync(tx, s)

            _in_order(_role(event), swallow, effect)

        _register_sync(app, case, topic, one, route)
        return

    async def aone(event: Event, tx: Any, session: AsyncSession | None) -> None:
        async def effect() -> None:
            if session is None:
                await tx.execute(s.effect, _params(group, event))
            else:
                session.add(orm_effect(event))
                await session.flush()

        async def swallow() -> None:
            if case.orm == "session":
                assert session is not None
                with contextlib.suppress(Exception):
                    await session.execute(text(s.refused_text))
            else:
                await case.way.async_(tx, s)

        role = _role(event)
        if role == "swallows-then-writes":
            await swallow()
            await effect()
        elif role == "writes-then-swallows":
            await effect()
            await swallow()
        else:
            await effect()

    _register_async(app, case, topic, aone, route)


def _in_order(role: str, swallow: Callable[[], None], effect: Callable[[], None]) -> None:
    if role == "swallows-then-writes":
        swallow()
        effect()
    elif role == "writes-then-swallows":
        effect()
        swallow()
    else:
        effect()


def _params(group: str, event: Event) -> tuple[Any, ...]:
    return (group, event.id, event.topic, event.partition, event.offset)


def _register_sync(
    app: App, case: Case, topic: str, one: Callable[[Event, Any, Any], None], route: Any
) -> None:
    register_on = app.handler(topic, batch=case.batch, **route)
    if case.batch and case.orm:

        def batch_orm(events: list[Event], tx: Any, session: Session) -> None:
            for event in events:
                one(event, tx, session)

        register_on(batch_orm)
    elif case.batch:

        def batch_raw(events: list[Event], tx: Any) -> None:
            for event in events:
                one(event, tx, None)

        register_on(batch_raw)
    elif case.orm:

        def event_orm(event: Event, tx: Any, session: Session) -> None:
            one(event, tx, session)

        register_on(event_orm)
    else:

        def event_raw(event: Event, tx: Any) -> None:
            one(event, tx, None)

        register_on(event_raw)


def _register_async(
    app: App,
    case: Case,
    topic: str,
    one: Callable[[Event, Any, Any], Awaitable[None]],
    route: Any,
) -> None:
    register_on = app.handler(topic, batch=case.batch, **route)
    if case.batch and case.orm:

        async def batch_orm(events: list[Event], tx: Any, session: AsyncSession) -> None:
            for event in events:
                await one(event, tx, session)

        register_on(batch_orm)
    elif case.batch:

        async def batch_raw(events: list[Event], tx: Any) -> None:
            for event in events:
                await one(event, tx, None)

        register_on(batch_raw)
    elif case.orm:

        async def event_orm(event: Event, tx: Any, session: AsyncSession) -> None:
            await one(event, tx, session)

        register_on(event_orm)
    else:

        async def event_raw(event: Event, tx: Any) -> None:
            await one(event, tx, None)

        register_on(event_raw)


def ids(case: Case) -> Sequence[str]:
    """The event ids of ``case``'s topic, in offset order."""
    return [f"{case.name}/{role}" for role in ROLES]
