"""The test database: a schema per test with the inbox and an effect table, and its teardown.

The effect table has **no unique key** on the event id, on purpose: an event
applied twice shows up as two rows, so "exactly once" is checked by counting.
The same table serves the fault suite's :mod:`tests.support.effect_app` (which
leaves ``consumer`` empty) and the integration tests' app (which fills it in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX

Conn = psycopg.Connection[tuple[Any, ...]]


def prepare_schema(database_url: str, schema: str, table: str = "effects") -> None:
    """Migrate the inbox into ``schema`` and create the effect table ``table`` (idempotent)."""
    apply_migrations(database_url, schema, [INBOX])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.{} (seq bigserial PRIMARY KEY, consumer text,"
                ' event_id text, topic text, partition int, "offset" bigint, pid int)'
            ).format(sql.Identifier(schema), sql.Identifier(table))
        )


def drop_schema(database_url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (a test's cleanup)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def terminate_open_transactions(database_url: str) -> int:
    """``pg_terminate_backend`` every other session inside an open transaction; return how many.

    A worker whose handler sleeps inside its transaction shows ``idle in
    transaction``, or ``active`` while its handlers' pipelined statements
    run; the tests' own connections are autocommit and never do.
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state IN ('idle in transaction', 'active') AND xact_start IS NOT NULL"
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def with_application_name(database_url: str, name: str) -> str:
    """``database_url`` with ``application_name=name``: its sessions show by that name.

    pg_stat_activity then tells one worker's backends from another's, so a
    test can see whose transaction is open and who waits for whom.
    """
    return f"{database_url}{'&' if '?' in database_url else '?'}application_name={name}"


def writing(database_url: str, name: str) -> bool:
    """Whether a session named ``name`` has a transaction open that wrote (holds an xid).

    A worker's batch shows so once its claim ran: its handlers then run
    inside that transaction. Only sessions of that ``application_name``
    count (see :func:`with_application_name`): the server is shared.
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND backend_xid IS NOT NULL",
            (name,),
        ).fetchone()
    return bool(row and row[0])


@dataclass(frozen=True)
class Backend:
    """One session of the database, as pg_stat_activity shows it."""

    pid: int
    application: str
    state: str | None
    in_transaction: bool
    waiting_for_lock: bool
    blocked_by: tuple[int, ...]
    query: str


def backends(database_url: str) -> list[Backend]:
    """Every other session of ``database_url``'s database, with what it waits for."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name, state, xact_start IS NOT NULL,"
            " wait_event_type IS NOT DISTINCT FROM 'Lock', pg_blocking_pids(pid), query"
            " FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
        ).fetchall()
    return [Backend(r[0], r[1], r[2], r[3], r[4], tuple(r[5]), r[6]) for r in rows]


def stuck_backends(database_url: str) -> list[Backend]:
    """Sessions left waiting for a lock or holding a transaction open (none should be)."""
    return [b for b in backends(database_url) if b.waiting_for_lock or b.in_transaction]
