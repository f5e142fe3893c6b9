"""Sent outbox rows outlive their records on the broker: kinbox outbox cleanup and the relay's."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from producer_outbox import enqueue
from producer_outbox.schema import OUTBOX
from tests.integration.ops_support import ROOT, stop, topic_pair
from tests.support.outbox import outbox_command
from tests.support.waiting import wait_for

DAY_MS = 86_400_000
Conn = psycopg.Connection[tuple[object, ...]]


def sent_row(stack: Stack, db: Conn, schema: str, topic: str, days_ago: float) -> str:
    """One outbox row of ``topic``, marked sent that many days ago; its id."""
    with psycopg.connect(stack.database_url) as conn, conn.transaction():
        row_id = enqueue(conn, topic, {"n": 1}, key="k", schema=schema)
    db.execute(
        sql.SQL(
            "UPDATE {} SET status = 'sent', sent_at = now() - make_interval(days => %s)"
            " WHERE id = %s"
        ).format(sql.Identifier(schema, "outbox")),
        (days_ago, row_id),
    )
    return str(row_id)


def ids(db: Conn, schema: str) -> set[str]:
    query = sql.SQL("SELECT id::text FROM {}").format(sql.Identifier(schema, "outbox"))
    return {str(row[0]) for row in db.execute(query)}


def test_cleanup_keeps_rows_their_topic_still_keeps_unless_forced(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a row sent 10 days ago to a topic kept 30 days, and one sent 10
    # days ago to a topic kept forever
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    month = topic_pair(stack.bootstrap_servers, config={"retention.ms": str(30 * DAY_MS)})
    forever = topic_pair(stack.bootstrap_servers, config={"retention.ms": "-1"})
    kept = sent_row(stack, db, schema, month, 10)
    endless = sent_row(stack, db, schema, forever, 10)

    # When cleaning rows older than 7 days: refused, as the topic keeps its records 30
    refused = outbox_command(stack, schema, "cleanup", "--retention-days", "7")
    assert refused.returncode == 5, refused.stderr
    assert f"topic {month!r} keeps its records that long" in refused.stderr
    assert "--retention-days 30 or more, or --force" in refused.stderr
    assert ids(db, schema) == {kept, endless}

    # Then with --force both go; a topic kept forever never set a floor
    forced = outbox_command(stack, schema, "cleanup", "--retention-days", "7", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "deleted 2 sent outbox rows older than 7 days" in forced.stdout
    assert ids(db, schema) == set()
    alone = sent_row(stack, db, schema, forever, 10)
    assert alone in ids(db, schema)
    done = outbox_command(stack, schema, "cleanup", "--retention-days", "7")
    assert done.returncode == 0, done.stderr
    assert f"topics kept forever set no floor: {forever}" in done.stdout
    assert ids(db, schema) == set()


def test_the_relays_cleanup_waits_for_the_topics_retention(
    stack: Stack, schema: str, db: Conn, tmp_path: Path
) -> None:
    # Given rows sent 10 and 40 days ago to a topic kept 30 days
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    month = topic_pair(stack.bootstrap_servers, config={"retention.ms": str(30 * DAY_MS)})
    young = sent_row(stack, db, schema, month, 10)
    old = sent_row(stack, db, schema, month, 40)

    # When a relay with a 7-day retention cleans up every half second
    log = tmp_path / "relay.log"
    command = [
        sys.executable, "-m", "kinbox", "outbox", "relay", "--database-url", stack.database_url,
        "--schema", schema, "--bootstrap-servers", stack.bootstrap_servers,
        "--retention-days", "7", "--cleanup-interval", "0.5", "--poll-interval", "0.2",
    ]  # fmt: skip
    with log.open("wb") as sink:
        relay = subprocess.Popen(command, cwd=ROOT, stderr=sink)
        try:
            # Then the 40-day-old row goes, the 10-day-old one stays, and it says why
            wait_for(lambda: old not in ids(db, schema), 60, "the old row deleted")
            wait_for(lambda: "keeps its records that long" in log.read_text(), 30, "the log")
            time.sleep(1.5)  # a few more cleanups
            assert ids(db, schema) == {young}
        finally:
            assert stop(relay) == 0
    assert "sent rows are kept 30 days, not 7" in log.read_text()
