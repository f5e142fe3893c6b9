"""Per-key order with concurrent writers of one key: (txid, seq), never seq or commit order.

The interleaving is driven by hand on separate connections, so the three
orders really differ: the transactions take their ids in one order, enqueue
in another and commit in a third.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack

import psycopg
import pytest
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.outbox import consume, count, migrate_outbox, running_relay, same_lane_key
from tests.support.waiting import wait_for

LANES = 8


def _xid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("relays", [1, 2])
def test_interleaved_writers_of_one_key_are_published_in_txid_then_seq_order(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, relays: int
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic(partitions=3)
    key = "order-42"
    probe_key = same_lane_key(db, key, LANES)
    with ExitStack() as opened:
        for _ in range(relays):
            opened.enter_context(running_relay(stack, schema, lanes=LANES))
        t1, t2, t3, probe = (
            opened.enter_context(psycopg.connect(stack.database_url)) for _ in range(4)
        )
        # Given a probe transaction with the oldest id, then t1 < t2 < t3 by id
        xids = [_xid(c) for c in (probe, t1, t2, t3)]
        assert xids == sorted(xids)
        # which enqueue rows of one key in another order (seq: t3, t1, t2, t3, t1)
        enqueued: dict[str, list[str]] = {"t1": [], "t2": [], "t3": []}
        for name, conn in [("t3", t3), ("t1", t1), ("t2", t2), ("t3", t3), ("t1", t1)]:
            n = sum(len(v) for v in enqueued.values())
            enqueued[name].append(str(enqueue(conn, topic, {"n": n}, key=key, schema=schema)))
        seq_order = [
            enqueued[n][i] for n, i in [("t3", 0), ("t1", 0), ("t2", 0), ("t3", 1), ("t1", 1)]
        ]
        # and commit in a third order: t2, t3, while t1 stays open
        t2.commit()
        t3.commit()
        # When the probe (same lane, id below t1's) commits after them and is published
        probe_id = enqueue(probe, topic, {"n": "probe"}, key=probe_key, schema=schema)
        probe.commit()
        wait_for(
            lambda: count(db, schema, f"id = '{probe_id}' AND status = 'sent'") == 1,
            what="probe row published",
        )
        # Then the claim that published it saw t2's and t3's rows and held them:
        # t1, with a lower id, could still add rows of the key before them
        assert count(db, schema, f"aggregateid = '{key}' AND status = 'sent'") == 0
        early = consume(stack, topic, 1, linger=1.0)
        assert [r.key for r in early] == [probe_key], "a row went out before it may"
        # When t1 commits last
        t1.commit()
        wait_for(lambda: count(db, schema, "status = 'sent'") == 6, what="every row published")
    # Then the key's rows are in Kafka in (txid, seq) order: t1's, t2's, t3's,
    # each transaction's in its enqueue order — neither seq nor commit order
    expected = enqueued["t1"] + enqueued["t2"] + enqueued["t3"]
    commit_order = enqueued["t2"] + enqueued["t3"] + enqueued["t1"]
    assert expected != seq_order and expected != commit_order
    received = consume(stack, topic, 6, linger=1.0)
    published = [r.event_id for r in received if r.key == key]
    assert published == expected
    stored = db.execute(
        sql.SQL("SELECT id::text FROM {}.outbox WHERE aggregateid = %s ORDER BY txid, seq").format(
            sql.Identifier(schema)
        ),
        (key,),
    ).fetchall()
    assert [r[0] for r in stored] == expected


def test_a_transaction_waiting_for_a_row_lock_gets_its_id_only_with_the_lock(
    stack: Stack, schema: str, db: Conn
) -> None:
    """What the docs' commit-order advice (docs/outbox.md) rests on, checked on this PostgreSQL.

    SELECT … FOR UPDATE assigns the waiting transaction no id until it holds
    the lock, so writers that lock the aggregate first are published in commit
    order; a waiting UPDATE already has its id.
    """
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    table = sql.Identifier(schema, "aggregate")
    db.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int)").format(table))
    db.execute(sql.SQL("INSERT INTO {} VALUES (1, 0)").format(table))
    lock = sql.SQL("SELECT v FROM {} WHERE id = 1 FOR UPDATE").format(table)
    update = sql.SQL("UPDATE {} SET v = v + 1 WHERE id = 1").format(table)
    for statement, waiter_has_id in [(lock, False), (update, True)]:
        with (
            psycopg.connect(stack.database_url) as holder,
            psycopg.connect(stack.database_url) as waiter,
        ):
            holder.execute(statement)
            holder_xid = _xid(holder)
            pid = waiter.info.backend_pid
            thread = threading.Thread(target=waiter.execute, args=(statement,))
            thread.start()

            def waiting(pid: int = pid) -> bool:
                row = db.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                return row is not None and row[0] == "Lock"

            wait_for(waiting, timeout=10, what="the second transaction waiting for the lock")
            row = db.execute(
                "SELECT backend_xid FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            assert row is not None and (row[0] is not None) == waiter_has_id, statement
            holder.commit()
            thread.join(10)
            assert _xid(waiter) > holder_xid
            waiter.commit()
