"""Async handlers against the real broker and PostgreSQL: the same guarantees as sync ones."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from kinbox.app import App
from kinbox.core.errors import DeadLetter, StoreError, TransactionControlError
from kinbox.core.event import Event
from kinbox.core.steps import Call, Seen, Steps, SyncPipeline, pipelined
from kinbox.devstack.stack import Stack
from kinbox.params.wrap import prepare
from kinbox.store.awaiting import AsyncPostgresInboxStore, MixedInboxStore
from tests.conftest import MakeTopic
from tests.integration.failure_support import dead_letters, header, running, statuses
from tests.integration.inbox_support import committed, effects, produce, settings
from tests.integration.orm_support import Note, note_rows, on_path, run_three_notes
from tests.integration.orm_support import notes as notes  # a fixture of the tests here
from tests.support.database import Conn, prepare_schema
from tests.support.waiting import wait_for


def insert_effect(schema: str, group: str) -> sql.Composed:
    return sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, 0)"
    ).format(sql.Identifier(schema))


def params(group: str, event: Event) -> tuple[Any, ...]:
    return (group, event.id, event.topic, event.partition, event.offset)


def fresh(stack: Stack, make_topic: MakeTopic, schema: str, partitions: int = 1) -> tuple[
    App, str, str
]:  # fmt: skip
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    return App(group_id=group, schema=schema), make_topic(partitions=partitions), group


def test_async_events_are_applied_once_and_duplicates_suppressed(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given an async handler writing through its AsyncConnection, and an event delivered twice
    app, topic, group = fresh(stack, make_topic, schema, partitions=2)
    insert = insert_effect(schema, group)
    connections: set[type] = set()

    @app.handler(topic)
    async def apply(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        connections.add(type(tx))
        await asyncio.sleep(0)
        await tx.execute(insert, params(group, event))

    ids = [(f"e{i}", i % 2) for i in range(40)] + [("e3", 1), ("e4", 0)]
    produce(stack.bootstrap_servers, topic, ids)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)

    # When a worker consumes them
    with running(app, config):
        wait_for(lambda: sum(committed(stack.bootstrap_servers, group, topic, 2).values()) == 42)

    # Then each effect committed once, on the AsyncConnection
    assert sorted(row[1] for row in effects(db, schema)) == sorted(f"e{i}" for i in range(40))
    assert connections == {psycopg.AsyncConnection}


def test_an_async_batch_handler_applies_each_fresh_event_once(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    app, topic, group = fresh(stack, make_topic, schema)
    insert = insert_effect(schema, group)
    sizes: list[int] = []

    @app.handler(topic, batch=True)
    async def apply(events: list[Event], tx: psycopg.AsyncConnection[Any]) -> None:
        sizes.append(len(events))
        async with tx.cursor() as cursor:
            await cursor.executemany(insert, [params(group, e) for e in events])

    produce(stack.bootstrap_servers, topic, [(f"e{i}", 0) for i in range(30)] + [("e0", 0)])
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 31})
    assert sorted(row[1] for row in effects(db, schema)) == sorted(f"e{i}" for i in range(30))
    assert sum(sizes) == 30


def test_an_async_poison_event_is_dead_lettered_and_the_others_applied(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given a batch with one event the async handler can never apply, and one it refuses
    app, topic, group = fresh(stack, make_topic, schema)
    insert = insert_effect(schema, group)

    @app.handler(topic, max_attempts=2)
    async def apply(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        await tx.execute(insert, params(group, event))
        if event.id == "poison":
            # A statement PostgreSQL refuses, as a bad value would make it
            await tx.execute("SELECT 1/0")
        if event.id == "refused":
            raise DeadLetter("not for us")

    ids = [("e1", 0), ("poison", 0), ("e2", 0), ("refused", 0), ("e3", 0)]
    produce(stack.bootstrap_servers, topic, ids)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 5})

    # Then the others are applied once each, the two are dead-lettered with their reasons
    assert [row[1] for row in effects(db, schema)] == ["e1", "e2", "e3"]
    marks = statuses(db, schema, group)
    assert marks["poison"][0] == marks["refused"][0] == "dead_lettered"
    reasons = {header(r, "kinbox.dlq.reason") for r in dead_letters(config, f"{topic}.dlq")}
    assert reasons == {"handler-error", "dead-letter-requested: not for us"}


def test_sync_and_async_handlers_in_one_app(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given one app with a sync handler on one topic and an async one on another
    app, async_topic, group = fresh(stack, make_topic, schema)
    sync_topic = make_topic(partitions=1)
    insert = insert_effect(schema, group)
    seen: dict[str, type] = {}

    @app.handler(async_topic)
    async def on_async(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        seen["async"] = type(tx)
        await tx.execute(insert, params(group, event))

    @app.handler(sync_topic)
    def on_sync(event: Event, tx: psycopg.Connection[Any]) -> None:
        seen["sync"] = type(tx)
        tx.execute(insert, params(group, event))

    produce(stack.bootstrap_servers, async_topic, [(f"a{i}", 0) for i in range(10)])
    produce(stack.bootstrap_servers, sync_topic, [(f"s{i}", 0) for i in range(10)] + [("s1", 0)])
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app, config):
        wait_for(
            lambda: (
                committed(stack.bootstrap_servers, group, async_topic, 1) == {0: 10}
                and committed(stack.bootstrap_servers, group, sync_topic, 1) == {0: 11}
            )
        )
    rows = sorted(row[1] for row in effects(db, schema))
    assert rows == sorted([f"a{i}" for i in range(10)] + [f"s{i}" for i in range(10)])
    assert seen == {"async": psycopg.AsyncConnection, "sync": psycopg.Connection}


def test_shutdown_commits_the_last_offsets_then_closes_the_loop_and_pool(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given an async app that is stopped while it works through a backlog
    app, topic, group = fresh(stack, make_topic, schema)
    insert = insert_effect(schema, group)

    @app.handler(topic)
    async def apply(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        await asyncio.sleep(0.01)
        await tx.execute(insert, params(group, event))

    produce(stack.bootstrap_servers, topic, [(f"e{i}", 0) for i in range(200)])
    named = f"{stack.database_url}?application_name={group}"
    config = settings(stack.bootstrap_servers, named, group, schema)
    with running(app, config):
        wait_for(lambda: len(effects(db, schema)) >= 20, what="some events applied")
    # Then what committed in the database is exactly what the offset covers
    offset = committed(stack.bootstrap_servers, group, topic, 1).get(0, 0)
    assert offset == len(effects(db, schema)) > 0
    # And the async side is gone: no loop thread, no connection of the worker's pools left
    assert not [t for t in threading.enumerate() if t.name == "kinbox-async-handlers"]
    left = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (group,)
    ).fetchone()
    assert left == (0,)


# --- AsyncSession -------------------------------------------------------------------------


def test_async_session_effects_commit_with_the_claim_once(
    stack: Stack, make_topic: MakeTopic, notes: str, db: Conn
) -> None:
    # Given an async handler writing through an AsyncSession; a failed first try; a duplicate
    group = f"g-{uuid.uuid4().hex[:8]}"
    app, topic = App(group_id=group, schema=notes), make_topic(partitions=1)
    tries: list[str] = []

    @app.handler(topic, max_attempts=3)
    async def apply(payload: dict[str, str], session: AsyncSession, event: Event) -> None:
        tries.append(event.id)
        session.add(Note(event_id=event.id, text=payload["text"]))
        await session.commit()  # harmless: only the session's savepoint
        if tries == ["e1"]:
            raise RuntimeError("crash after the session committed")
        count = await session.scalar(select(func.count()).select_from(Note))
        assert count is not None and count >= 1

    # Then each event's row committed once, the failed try's went with its rollback
    run_three_notes(stack, app, topic, group, notes, db)


@pytest.fixture
def async_store(stack: Stack, notes: str) -> Iterator[AsyncPostgresInboxStore]:
    mixed = MixedInboxStore(on_path(stack.database_url, notes), schema=notes, consumer="g")
    mixed.open()
    store = mixed.for_async()
    assert isinstance(store, AsyncPostgresInboxStore)
    yield store
    mixed.close()


def one_event() -> Event:
    return Event(id=f"e-{uuid.uuid4().hex[:8]}", topic="t", partition=0, offset=0, key=None,
                 value=b"x")  # fmt: skip


def test_an_async_handler_cannot_end_the_inbox_transaction(
    stack: Stack, notes: str, async_store: AsyncPostgresInboxStore, db: Conn
) -> None:
    async def commits(payload: bytes, session: AsyncSession) -> None:
        session.add(Note(event_id="c", text="c"))
        await (await session.connection()).commit()

    async def rolls_back(payload: bytes, session: AsyncSession) -> None:
        await (await session.connection()).rollback()

    for handler, verb in ((commits, "commit"), (rolls_back, "roll back")):
        call = prepare(handler, batch=False, where="test").bound(async_store, None).call
        with pytest.raises(TransactionControlError, match=f"cannot {verb} the inbox transaction"):
            async_store.run(partial(calls, partial(call, one_event())))
    assert note_rows(db, notes) == []


def execute(
    query: Any, params: tuple[Any, ...], connection: psycopg.AsyncConnection[Any]
) -> object:
    return connection.execute(query, params)


def calling(run: Callable[[Any], object]) -> Steps[object]:
    """A program that makes one awaited call on the connection, without a savepoint."""
    return (yield Call(run, "unguarded", awaits=True))


def calls(run: Callable[[Any], object], _tx: Seen) -> Steps[object]:
    """A transaction whose program is :func:`calling` ``run``."""
    return calling(run)


def test_an_outage_seen_by_an_async_handler_is_an_outage(
    stack: Stack, notes: str, async_store: AsyncPostgresInboxStore
) -> None:
    # A handler whose backend is terminated under it: the store calls it an outage
    async def handler(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        row = await (await tx.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        with psycopg.connect(stack.database_url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        await tx.execute("SELECT 1")

    outages = []

    def program(tx: Seen) -> Steps[object]:
        try:
            return (yield from calling(lambda c: handler(one_event(), c)))
        except Exception as exc:
            outages.append(tx.outage(exc))
            raise

    with pytest.raises((psycopg.Error, StoreError)):
        async_store.run(program)
    [outage] = outages
    assert outage is not None and outage.transient


def test_the_async_store_drives_a_real_pipeline_and_sees_its_failure(
    async_store: AsyncPostgresInboxStore, notes: str, db: Conn
) -> None:
    # What the pipelined optimistic pass uses (psycopg pipeline mode), on the loop
    insert = sql.SQL("INSERT INTO {}.notes (event_id, text) VALUES (%s, 'p')").format(
        sql.Identifier(notes)
    )

    def statements(*queries: tuple[Any, tuple[Any, ...]], sync: bool) -> Steps[object]:
        for query, params in queries:  # a handler's statements, sent without waiting
            yield from calling(partial(execute, query, params))
        return (yield SyncPipeline()) if sync else None

    inserts = [(insert, (f"p{n}",)) for n in range(3)]
    assert async_store.run(lambda _tx: pipelined(statements(*inserts, sync=True))) is True
    assert [r[0] for r in note_rows(db, notes)] == ["p0", "p1", "p2"]

    failing = [(insert, ("lost",)), ("SELECT 1/0", ())]
    with pytest.raises(StoreError, match="DivisionByZero"):
        async_store.run(lambda _tx: pipelined(statements(*failing, sync=False)))
    assert [r[0] for r in note_rows(db, notes)] == ["p0", "p1", "p2"]
