"""kinbox explain on the real stack: an event through the outbox, a handler, and its outbox rows.

The story: a business transaction enqueues a row; the relay publishes it;
a worker applies it and its handler enqueues a row in the same inbox
transaction; explain tells each step from the event id alone. Records
produced directly carry a W3C traceparent (valid, and malformed: the claim
stores NULL and goes on).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
from psycopg import sql

from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from producer_outbox import enqueue
from producer_outbox.schema import OUTBOX
from tests.integration.ops_support import ROOT, produce, start_worker, stop, topic_pair
from tests.support.outbox import relay_process
from tests.support.waiting import wait_for

Conn = psycopg.Connection[tuple[object, ...]]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def explain(stack: Stack, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinbox", "explain", *args,
         "--database-url", stack.database_url, "--schema", schema],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip


def as_json(stack: Stack, schema: str, event_id: str) -> dict[str, Any]:
    shown = explain(stack, schema, event_id, "--json")
    assert shown.returncode == 0, shown.stderr
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


def test_explain_follows_an_event_from_the_outbox_through_a_handler(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a relay, and a worker of group g whose handler enqueues an audit
    # row per event inside its inbox transaction; another group has rows too
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers, partitions=2)
    audit = topic_pair(stack.bootstrap_servers)
    group = f"g-{topic}"
    db.execute(
        sql.SQL(
            'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset")'
            " VALUES ('other', 'unrelated', 'elsewhere', 0, 0)"
        ).format(sql.Identifier(schema))
    )
    relay = relay_process(stack, schema)
    worker = start_worker(stack, topic, group, schema, env={"OPS_TEST_ENQUEUE": audit})
    try:
        # When a business transaction enqueues an event, and three records
        # come straight from a producer: with a trace, with a malformed
        # traceparent, and one the handler dead-letters
        with psycopg.connect(stack.database_url) as conn, conn.transaction():
            published = str(enqueue(conn, topic, {"n": 1}, key="k", schema=schema))
        traced = produce(
            stack.bootstrap_servers,
            topic,
            [{"n": 2}],
            headers=[("traceparent", f"00-{TRACE}-00f067aa0ba902b7-01".encode())],
        )
        garbled = produce(
            stack.bootstrap_servers, topic, [{"n": 3}], headers=[("traceparent", b"00-not-a-trace")]
        )
        bad = produce(stack.bootstrap_servers, topic, [{"bad": True}])  # fmt: skip
        count = sql.SQL("SELECT count(*) FROM {}.processed_events WHERE consumer = %s").format(
            sql.Identifier(schema)
        )
        wait_for(lambda: db.execute(count, (group,)).fetchone() == (4,), 60, "4 rows")
        sent = sql.SQL("SELECT count(*) FROM {}.outbox WHERE status = 'sent'").format(
            sql.Identifier(schema)
        )
        wait_for(lambda: db.execute(sent).fetchone() == (4,), 60, "the relay to send 4 rows")
    finally:
        assert stop(worker) == 0
        assert stop(relay) == 0

    # Then the outbox event: published from its row, applied by g, and what
    # g's transaction enqueued for it
    story = as_json(stack, schema, published)
    assert story["groups_searched"] == sorted([group, "other"])
    assert story["source"]["status"] == "sent" and story["source"]["topic"] == topic
    assert story["source"]["caused_by_consumer"] is None
    [seen] = story["processed"]
    assert (seen["consumer"], seen["status"], seen["topic"]) == (group, "applied", topic)
    assert story["not_seen_by"] == ["other"]
    [caused] = story["enqueued"]
    assert caused["topic"] == audit and caused["caused_by_consumer"] == group
    assert caused["caused_by_event_id"] == published and caused["status"] == "sent"
    text = explain(stack, schema, published).stdout
    assert "published from the outbox of this database:" in text
    assert f"{group}  applied  {topic}[" in text and "no row in: other" in text
    assert f"topic={audit}" in text and f"; by group {group}" in text

    # ... and the audit row, one step downstream: its own cause is the event above
    downstream = as_json(stack, schema, caused["id"])
    assert downstream["processed"] == [] and downstream["source"]["id"] == caused["id"]
    assert f"handling {published}" in explain(stack, schema, caused["id"]).stdout

    # The trace id comes from the record's traceparent; a malformed one is NULL
    assert as_json(stack, schema, traced[0])["processed"][0]["trace_id"] == TRACE
    assert as_json(stack, schema, garbled[0])["processed"][0]["trace_id"] is None
    assert as_json(stack, schema, garbled[0])["processed"][0]["status"] == "applied"
    # A dead letter says why, and its transaction enqueued nothing
    letter = as_json(stack, schema, bad[0])
    assert letter["processed"][0]["status"] == "dead_lettered"
    assert "bad event" in letter["processed"][0]["reason"] and letter["enqueued"] == []

    # An id nobody knows: exit 1
    unknown = explain(stack, schema, "no-such-event", "--group", group)
    assert unknown.returncode == 1 and "not found" in unknown.stdout
