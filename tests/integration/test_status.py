"""kinbox status against the real stack: a live group, a lagging one, parked rows, a slot."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg import sql

from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from producer_outbox.schema import OUTBOX
from tests.integration.ops_support import ROOT, produce, start_worker, stop, topic_pair
from tests.support.waiting import wait_for

Conn = psycopg.Connection[tuple[object, ...]]


def status(stack: Stack, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinbox", "status", *args,
         "--database-url", stack.database_url, "--schema", schema,
         "--bootstrap-servers", stack.bootstrap_servers],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip


def group_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in report["groups"] if g["group"] == name)


def test_status_of_a_running_group_then_of_one_left_behind(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a worker of group g on a 2-partition topic whose handler enqueues
    # one outbox row per event, and 10 events of which one is dead-lettered
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers, partitions=2)
    group = f"g-{topic}"
    worker = start_worker(stack, topic, group, schema, env={"OPS_TEST_ENQUEUE": "audit"})
    try:
        produce(stack.bootstrap_servers, topic, [{"bad": n == 4} for n in range(5)], partition=0)
        produce(stack.bootstrap_servers, topic, [{"n": n} for n in range(5)], partition=1)
        rows = sql.SQL("SELECT count(*) FROM {}.processed_events").format(sql.Identifier(schema))
        wait_for(lambda: db.execute(rows).fetchone() == (10,), 60, "10 rows")

        # When the operator asks while it runs
        def settled() -> bool:
            answer = status(stack, schema, "--json")
            live = group_of(json.loads(answer.stdout), group)
            return answer.returncode == 0 and live["lag"] == 0 and len(live["members"]) == 1

        wait_for(settled, 60, "the offsets committed")
        shown = status(stack, schema, "--json")
        text = status(stack, schema)
    finally:
        assert stop(worker) == 0

    # Then: one member holding both partitions, nothing behind, the window's
    # work by status, the dead letter, the outbox backlog, no slot, no warning
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    live = group_of(report, group)
    assert live["state"] == "Stable"
    assert [(p["topic"], p["partition"]) for p in live["members"][0]["partitions"]] == [
        (topic, 0), (topic, 1),
    ]  # fmt: skip
    assert [p["committed"] for p in live["partitions"]] == [5, 5]
    assert all(p["lag"] == 0 and p["oldest_unprocessed_seconds"] is None
               for p in live["partitions"])  # fmt: skip
    assert live["window"]["applied"]["rows"] == 9
    assert live["window"]["dead_lettered"]["rows"] == 1 and live["dead_lettered"] == 1
    assert report["outbox"]["pending"] == 9 and report["outbox"]["dead"] == 0
    assert report["processed_events"]["total_bytes"] > 0
    assert report["replication_slots"] == [] and report["warnings"] == []
    assert text.returncode == 0 and text.stdout.rstrip().endswith("OK")
    assert f"group {group}  (Stable, 1 member(s))" in text.stdout
    assert "applied 9 (" in text.stdout and "dead-lettered 1 in all" in text.stdout

    # When the group stops and 5 records written 10 minutes ago wait for it
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    for n in range(5):
        producer.produce(topic, b"{}", partition=0, timestamp=int(time.time() * 1000) - 600_000,
                         headers=[("event-id", f"late-{n}".encode())])  # fmt: skip
    assert producer.flush(30) == 0
    behind = status(stack, schema, "--json", "--group", group, "--max-age", "5m")

    # Then it is a probe failure: exit 8, saying which partition waits, for
    # how long, and that no member owns it
    assert behind.returncode == 8, behind.stderr
    report = json.loads(behind.stdout)
    late = group_of(report, group)
    assert late["state"] == "Empty" and late["members"] == [] and late["lag"] == 5
    assert [p["end"] for p in late["partitions"]] == [10, 5]
    p0 = next(p for p in late["partitions"] if p["partition"] == 0)
    assert p0["lag"] == 5 and p0["oldest_unprocessed_seconds"] >= 600
    assert any(f"{topic}[0]: the oldest unprocessed record waits" in w and "NOT ASSIGNED" in w
               for w in report["warnings"]), report["warnings"]  # fmt: skip
    assert "WARNING: group" in behind.stderr
    # ... and a lag threshold says it too
    lagging = status(stack, schema, "--json", "--group", group, "--max-lag", "4",
                     "--max-age", "1h")  # fmt: skip
    assert lagging.returncode == 8
    assert json.loads(lagging.stdout)["warnings"] == [
        f"group {group!r}: {topic}[0] is 5 records behind (threshold 4)"
    ]


def test_status_warns_of_parked_rows_and_a_slot_holding_wal(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a parked outbox row and a logical replication slot nobody reads
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    db.execute(
        sql.SQL(
            "INSERT INTO {}.outbox (id, topic, aggregatetype, aggregateid, payload, status,"
            " attempts, last_error) VALUES (gen_random_uuid(), 'orders', 'orders', 'k',"
            " '{{}}', 'dead', 10, 'MSG_SIZE_TOO_LARGE')"
        ).format(sql.Identifier(schema))
    )
    slot = f"slot_{schema}"
    db.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    try:
        db.execute(sql.SQL("CREATE TABLE {}.churn AS SELECT generate_series(1, 2000) n").format(
            sql.Identifier(schema)))  # fmt: skip

        # When asked with a slot threshold of 1 byte
        shown = status(stack, schema, "--json", "--slot-warn-bytes", "1")
    finally:
        db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))

    # Then both are warnings, and no group is needed for them
    assert shown.returncode == 8, shown.stderr
    report = json.loads(shown.stdout)
    assert report["groups"] == [] and report["outbox"]["dead"] == 1
    found = [s for s in report["replication_slots"] if s["name"] == slot]
    assert found and found[0]["retained_bytes"] > 1
    warnings = report["warnings"]
    assert any(w.startswith("outbox: 1 parked row(s) (threshold 0)") for w in warnings)
    assert any(f"replication slot {slot!r} holds back" in w for w in warnings), warnings
    assert status(stack, schema, "--json", "--max-parked", "1").returncode == 0


def test_status_describes_a_group_of_the_new_consumer_protocol(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a worker in a KIP-848 group (group.protocol=consumer)
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers, partitions=2)
    group = f"g-{topic}"
    worker = start_worker(stack, topic, group, schema, "-X", "group.protocol=consumer", fast=False)
    try:
        produce(stack.bootstrap_servers, topic, [{"n": 1}], partition=1)

        # Then status finds its member holding both partitions, and nothing behind
        def described() -> bool:
            answer = status(stack, schema, "--json", "--group", group)
            found = group_of(json.loads(answer.stdout), group)
            held = [p for m in found["members"] for p in m["partitions"]]
            return answer.returncode == 0 and len(held) == 2 and found["lag"] == 0

        wait_for(described, 60, "the member and its partitions")
    finally:
        assert stop(worker) == 0
