"""The test database: a schema per test with the inbox and an effect table, and its teardown.

The effect table has **no unique key** on the event id, on purpose: an event
applied twice shows up as two rows, so "exactly once" is checked by counting.
The same table serves the fault suite's :mod:`tests.support.effect_app` (which
leaves ``consumer`` empty) and the integration tests' app (which fills it in).
"""

from __future__ import annotations

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
    transaction``; the tests' own connections are autocommit and never do.
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state = 'idle in transaction'"
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)
