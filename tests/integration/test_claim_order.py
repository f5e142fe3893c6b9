"""Two batches claiming the same ids in different orders never deadlock each other.

A producer's duplicate can land in another partition (no key, or a key that
changed), so two partition batches running side by side may claim the same
ids. Each claim locks its ids' primary-key entries one after another: taken
in each batch's offset order, batch 1 could hold ``x`` while it waits for
``y``, which batch 2 holds while it waits for ``x`` — PostgreSQL then aborts
one of them after ``deadlock_timeout``. kinbox's claim takes its ids in one
order, the ids' own, so the later batch only waits for the earlier one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from kinbox.store.postgres import PostgresInboxStore
from tests.support.database import prepare_schema


def _events(partition: int, ids: list[str]) -> list[Event]:
    return [Event(i, "t", partition, offset, None, b"{}") for offset, i in enumerate(ids)]


def _blocked(conn: psycopg.Connection[Any], pid: int) -> bool:
    """Whether backend ``pid`` waits for a lock."""
    row = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


def _wait_blocked(conn: psycopg.Connection[Any], pids: dict[str, int], name: str) -> None:
    """Wait until batch ``name`` has its connection and waits for a lock on it."""
    deadline = time.monotonic() + 10
    while name not in pids or not _blocked(conn, pids[name]):
        assert time.monotonic() < deadline, f"batch {name} never waited for a lock"
        time.sleep(0.02)


def test_batches_claiming_shared_ids_in_opposite_orders_do_not_deadlock(
    stack: Stack, schema: str
) -> None:
    prepare_schema(stack.database_url, schema)
    store = PostgresInboxStore(stack.database_url, schema=schema, consumer="g", pool_size=2)
    store.open()
    fresh: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    pids: dict[str, int] = {}
    go_on = {name: threading.Event() for name in ("one", "two")}
    claimed = {name: threading.Event() for name in ("one", "two")}

    def batch(name: str, events: list[Event]) -> None:
        try:
            with store.transaction() as tx:
                pids[name] = tx.connection.info.backend_pid
                claimed_now = tx.claim(events)
                fresh[name] = [e.id for e in claimed_now]
                claimed[name].set()
                go_on[name].wait(30)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
            claimed[name].set()

    table = sql.Identifier(schema, "processed_events")
    try:
        _race(stack, table, batch, pids, claimed, go_on)
    finally:
        # A failed step must not leave a batch waiting on its event, or the pool open.
        for gate in go_on.values():
            gate.set()
        store.close()
    assert not errors, errors
    assert sorted(fresh["one"]) == ["e-1", "e-2", "e-3"]
    assert fresh["two"] == []


def _race(
    stack: Stack,
    table: sql.Identifier,
    batch: Callable[[str, list[Event]], None],
    pids: dict[str, int],
    claimed: dict[str, threading.Event],
    go_on: dict[str, threading.Event],
) -> None:
    """Batch one waits in its claim on a third transaction; batch two claims meanwhile."""
    with (
        psycopg.connect(stack.database_url, autocommit=True) as watcher,
        psycopg.connect(stack.database_url) as other,
    ):
        # Given another transaction that holds "e-3" (claimed, not committed yet)
        other.execute(
            sql.SQL(
                'INSERT INTO {} (consumer, event_id, status, topic, partition, "offset")'
                " VALUES ('g', 'e-3', 'applied', 't', 9, 0)"
            ).format(table)
        )
        # When batch one (offsets: e-1, e-3, e-2) is waiting in its claim for
        # e-3, and batch two (offsets: e-2, e-1) claims meanwhile
        one = threading.Thread(target=batch, args=("one", _events(0, ["e-1", "e-3", "e-2"])))
        one.start()
        _wait_blocked(watcher, pids, "one")
        two = threading.Thread(target=batch, args=("two", _events(1, ["e-2", "e-1"])))
        two.start()
        _wait_blocked(watcher, pids, "two")
        # and the other transaction gives e-3 up
        other.rollback()
        # Then batch one claims all three, and batch two waits for it: no deadlock
        assert claimed["one"].wait(10), "batch one never finished its claim"
        go_on["one"].set()
        one.join(10)
        assert claimed["two"].wait(10), "batch two never finished its claim"
        go_on["two"].set()
        two.join(10)
