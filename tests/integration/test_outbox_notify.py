"""Every writer of the outbox wakes the relay: the table's trigger, not the writer, notifies.

Rows written by plain SQL, in bulk or by ``COPY`` send the relay's
notification at their COMMIT exactly as :func:`~producer_outbox.writer.enqueue`
does; a rolled-back write sends none. Checked on a listening connection (the
notifications themselves) and on a relay whose poll would take an hour.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.schema import notify_channel
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.outbox import count, migrate_outbox, running_relay
from tests.support.waiting import wait_for


def _insert(schema: str, rows: int) -> sql.Composed:
    """A plain multi-row INSERT of ``rows`` outbox rows, as any writer could send."""
    values = sql.SQL(", ").join(
        sql.SQL("(gen_random_uuid(), %s, %s, 'k', '{}'::jsonb)") for _ in range(rows)
    )
    return sql.SQL(
        "INSERT INTO {}.outbox (id, topic, aggregatetype, aggregateid, payload) VALUES {}"
    ).format(sql.Identifier(schema), values)


def _heard(listener: psycopg.Connection[Any], wait: float = 1.0) -> list[str]:
    """The channels of the notifications that arrive within ``wait`` seconds."""
    return [n.channel for n in listener.notifies(timeout=wait)]


def test_every_writer_notifies_the_relays_channel_once_per_transaction_at_commit(
    stack: Stack, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    channel = notify_channel(schema)
    with psycopg.connect(stack.database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        with psycopg.connect(stack.database_url) as writer:
            # A plain single-row INSERT, autocommit
            writer.autocommit = True
            writer.execute(_insert(schema, 1), ("t", "t"))
            assert _heard(listener) == [channel]
            writer.autocommit = False
            # Two multi-row INSERTs in one transaction: nothing before COMMIT, one after
            writer.execute(_insert(schema, 3), ("t", "t") * 3)
            writer.execute(_insert(schema, 2), ("t", "t") * 2)
            assert _heard(listener, 0.5) == []
            writer.commit()
            assert _heard(listener) == [channel]
            # COPY
            copy = sql.SQL("COPY {}.outbox (id, topic, aggregatetype, payload) FROM STDIN").format(
                sql.Identifier(schema)
            )
            with writer.cursor().copy(copy) as rows:
                rows.write_row((uuid.uuid4(), "t", "t", "{}"))
            writer.commit()
            assert _heard(listener) == [channel]
            # enqueue(), which sends no notification of its own
            enqueue(writer, "t", {"n": 1}, schema=schema)
            writer.commit()
            assert _heard(listener) == [channel]
            # A rolled-back write wakes nobody
            writer.execute(_insert(schema, 1), ("t", "t"))
            writer.rollback()
            assert _heard(listener) == []
    assert count(db, schema) == 8


def test_a_row_written_by_plain_sql_is_published_without_waiting_for_the_poll(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    # Given a relay that would poll the table once an hour, idle on LISTEN
    with running_relay(stack, schema, poll_interval=3600.0):
        time.sleep(1.0)
        # When a row is written by SQL, not by enqueue()
        db.execute(_insert(schema, 1), (topic, topic))
        # Then the relay publishes it (the timeout is only a bound: its poll is an hour off)
        wait_for(lambda: count(db, schema, "status = 'sent'") == 1, timeout=60, what="row sent")
