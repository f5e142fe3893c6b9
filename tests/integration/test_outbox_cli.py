"""`kinbox outbox status` and `kinbox outbox cleanup` against the real server."""

from __future__ import annotations

import json

from psycopg import sql

from kinbox.devstack.stack import Stack
from tests.support.database import Conn
from tests.support.outbox import count, enqueue_many, migrate_outbox, outbox_command


def test_status_shows_backlog_and_parked_rows_and_cleanup_removes_only_old_sent(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given 5 rows: 2 pending, 1 parked as dead after 10 tries, 2 sent (one of them 30 days ago)
    migrate_outbox(db, schema)
    enqueue_many(stack.database_url, schema, "orders", [(f"k{n}", n) for n in range(5)])
    outbox = sql.Identifier(schema, "outbox")
    ids = [r[0] for r in db.execute(sql.SQL("SELECT id FROM {} ORDER BY seq").format(outbox))]
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'dead', attempts = 10, last_error = 'MSG_SIZE_TOO_LARGE'"
            " WHERE id = %s"
        ).format(outbox),
        (ids[2],),
    )
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'sent', sent_at = now() - %s::interval WHERE id = %s"
        ).format(outbox),
        ("30 days", ids[3]),
    )
    db.execute(
        sql.SQL("UPDATE {} SET status = 'sent', sent_at = now() WHERE id = %s").format(outbox),
        (ids[4],),
    )

    # When the operator asks for the status
    shown = outbox_command(stack, schema, "status", "--json")
    text = outbox_command(stack, schema, "status")

    # Then it counts each state and names the parked row with its error
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert (state["pending"], state["dead"], state["sent"]) == (2, 1, 2)
    assert state["oldest_pending_seconds"] >= 0
    assert [row["id"] for row in state["parked"]] == [str(ids[2])]
    assert "MSG_SIZE_TOO_LARGE" in text.stdout and "dead (parked): 1" in text.stdout
    # and the key the parked row blocks (no later row of it waits), no failing topic
    assert state["blocked"] == 1 and state["failing_topics"] == []
    assert [(k["key"], k["held"]) for k in state["blocked_keys"]] == [("k2", 0)]
    assert "blocked keys (a parked row holds back their later rows): 1" in text.stdout

    # When cleanup runs with the default 7-day retention
    cleaned = outbox_command(stack, schema, "cleanup", "--batch-size", "1")
    # Then only the old sent row is gone; pending, parked and recent rows stay
    assert cleaned.returncode == 0, cleaned.stderr
    assert count(db, schema) == 4
    assert count(db, schema, "status = 'sent'") == 1


def test_cleanup_under_cdc_goes_by_age_whatever_the_status(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given 6 rows as CDC leaves them, all pending (nothing marks them sent):
    # 3 created 10 days ago, 3 just now
    migrate_outbox(db, schema)
    enqueue_many(stack.database_url, schema, "orders", [(f"k{n}", n) for n in range(6)])
    outbox = sql.Identifier(schema, "outbox")
    db.execute(
        sql.SQL(
            "UPDATE {0} SET created_at = now() - interval '10 days'"
            " WHERE seq IN (SELECT seq FROM {0} ORDER BY seq LIMIT 3)"
        ).format(outbox)
    )
    # When the relay's cleanup runs, nothing goes: no row is sent
    relay_mode = outbox_command(stack, schema, "cleanup", "--retention-days", "7")
    assert relay_mode.returncode == 0, relay_mode.stderr
    assert count(db, schema) == 6
    # When the CDC cleanup runs with a 7-day retention, in batches of 2
    cdc_mode = outbox_command(
        stack, schema, "cleanup", "--cdc", "--retention-days", "7", "--batch-size", "2"
    )
    # Then the old rows are gone and the young ones stay, pending as they were
    assert cdc_mode.returncode == 0, cdc_mode.stderr
    assert "deleted 3 outbox rows older than 7 days" in cdc_mode.stdout
    assert count(db, schema) == 3
    assert count(db, schema, "status = 'pending' AND created_at > now() - interval '1 day'") == 3


def test_debezium_register_refuses_a_header_column_with_a_default_or_none_at_all(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a header column with a DEFAULT, which Debezium would publish for a NULL
    migrate_outbox(db, schema)
    db.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN tenant text DEFAULT ''").format(
            sql.Identifier(schema, "outbox")
        )
    )
    for column, reason in (("tenant", "has a DEFAULT"), ("region", "no such column")):
        # When it is registered as a header column (Connect is never reached)
        refused = outbox_command(
            stack, schema, "debezium-config", "--register", "http://127.0.0.1:9",
            "--header-column", column,
        )  # fmt: skip
        # Then registration stops at once with the configuration exit code, naming it
        assert refused.returncode == 2, refused.stderr
        assert column in refused.stderr and reason in refused.stderr
    # ... before it changed the outbox
    assert db.execute(
        "SELECT count(*) FROM pg_constraint WHERE conname = 'outbox_cdc_json_only'"
        " AND conrelid = to_regclass(%s)",
        (f"{schema}.outbox",),
    ).fetchone() == (0,)
