"""The relay against a real Kafka broker and PostgreSQL: publish, order, races, failures."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import psycopg
import pytest

from kinbox.devstack.stack import Stack
from producer_outbox.cleanup import delete_sent
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.outbox import consume, count, migrate_outbox, running_relay
from tests.support.waiting import wait_for


def test_rows_reach_kafka_with_key_and_headers(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    with db.transaction():
        json_id = enqueue(
            db,
            topic,
            {"userId": "u1", "lessonId": 7},
            key="u1",
            headers={"trace": "abc"},
            event_type="lesson.completed",
            schema=schema,
        )
        raw_id = enqueue(db, topic, b"\x00\xffraw", schema=schema, event_id=uuid.uuid4())
    with running_relay(stack, schema):
        wait_for(lambda: count(db, schema, "status = 'sent'") == 2, what="2 rows sent")
    records = {r.event_id: r for r in consume(stack, topic, 2)}
    assert set(records) == {str(json_id), str(raw_id)}
    first = records[str(json_id)]
    # Unless told, the event id is time-ordered (version 7); a given one is kept.
    assert uuid.UUID(first.event_id).version == 7
    assert uuid.UUID(records[str(raw_id)].event_id).version == 4
    assert first.key == "u1"
    assert json.loads(first.value) == {"userId": "u1", "lessonId": 7}
    assert first.headers["trace"] == b"abc"
    assert first.headers["ce_id"] == str(json_id).encode()
    assert first.headers["ce_type"] == b"lesson.completed"
    assert first.headers["ce_specversion"] == b"1.0"
    assert records[str(raw_id)].value == b"\x00\xffraw"
    assert records[str(raw_id)].key is None
    assert "ce_id" not in records[str(raw_id)].headers


def test_rolled_back_transaction_publishes_nothing(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    # Given a business transaction that enqueues, then rolls back
    with pytest.raises(RuntimeError), db.transaction():
        enqueue(db, topic, {"n": "rolled back"}, key="k", schema=schema)
        raise RuntimeError("business failure")
    kept = enqueue(db, topic, {"n": "kept"}, key="k", schema=schema)
    # When the relay runs
    with running_relay(stack, schema):
        wait_for(lambda: count(db, schema, "status = 'sent'") == 1)
    # Then only the committed event exists, in the DB and in Kafka
    assert count(db, schema) == 1
    received = consume(stack, topic, 1, linger=2.0)
    assert [r.event_id for r in received] == [str(kept)]


def test_notify_wakes_relay_long_before_the_poll_interval(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    with running_relay(stack, schema, poll_interval=30.0):
        time.sleep(1.0)  # the relay is idle, waiting on LISTEN
        started = time.monotonic()
        enqueue(db, topic, {"n": 1}, key="k", schema=schema)
        wait_for(lambda: count(db, schema, "status = 'sent'") == 1, timeout=10)
        assert time.monotonic() - started < 2.0


def test_sequence_gap_race_keeps_the_late_committer_and_key_order(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    with (
        running_relay(stack, schema),
        psycopg.connect(stack.database_url) as a,
        psycopg.connect(stack.database_url) as b,
    ):
        # Given transaction A takes the lower seq for key k but stays open
        a_id = enqueue(a, topic, {"n": 1}, key="k", schema=schema)
        # and transaction B takes a higher seq for the same key and commits first
        b_id = enqueue(b, topic, {"n": 2}, key="k", schema=schema)
        b.commit()
        # When the relay runs meanwhile, it must not publish B ahead of A
        time.sleep(1.5)
        assert count(db, schema, "status = 'sent'") == 0
        # Then once A commits, both go out, A first
        a.commit()
        wait_for(lambda: count(db, schema, "status = 'sent'") == 2, what="both rows sent")
    received = consume(stack, topic, 2, linger=1.0)
    assert [r.event_id for r in received] == [str(a_id), str(b_id)]


def test_broker_down_rows_stay_pending_then_go_out(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    if stack.kafka is None:
        pytest.skip("needs the locally started broker to pause it (external Kafka given)")
    migrate_outbox(db, schema)
    topic = make_topic()
    kafka: dict[str, Any] = {"message.timeout.ms": "1500", "socket.timeout.ms": "1000"}
    # max_attempts=1: a single counted failure would park a row at once
    with running_relay(
        stack, schema, kafka=kafka, backoff_base=0.2, backoff_max=1.0, max_attempts=1
    ):
        enqueue(db, topic, {"n": 0}, key="k", schema=schema)
        wait_for(lambda: count(db, schema, "status = 'sent'") == 1, what="warm-up row sent")
        # Given the broker stops answering
        stack.kafka.pause()
        try:
            for n in range(1, 11):
                enqueue(db, topic, {"n": n}, key=f"k{n % 3}", schema=schema)
            # Then the rows stay unsent with the error recorded; an outage is
            # never counted as an attempt, so it can never park them
            wait_for(
                lambda: count(db, schema, "status = 'pending' AND last_error IS NOT NULL") >= 3,
                timeout=30,
                what="failed tries recorded",
            )
            assert count(db, schema, "status = 'dead'") == 0
            assert count(db, schema, "status = 'pending'") == 10
            assert count(db, schema, "status = 'pending' AND attempts > 0") == 0
        finally:
            stack.kafka.resume()
        # When it is back, everything goes out
        wait_for(lambda: count(db, schema, "status = 'sent'") == 11, timeout=60)
    received = consume(stack, topic, 11, linger=1.0)
    assert len({r.event_id for r in received}) == 11


def test_cleanup_deletes_only_old_sent_rows_in_batches(schema: str, db: Conn) -> None:
    migrate_outbox(db, schema)
    for n in range(7):
        enqueue(db, "t", {"n": n}, key="k", schema=schema)
    table = f"{schema}.outbox"
    db.execute(
        f"UPDATE {table} SET status = 'sent', sent_at = now() - interval '8 days'"
        " WHERE seq IN (SELECT seq FROM " + table + " ORDER BY seq LIMIT 5)"
    )
    db.execute(f"UPDATE {table} SET status = 'dead' WHERE seq = (SELECT max(seq) FROM {table})")
    assert delete_sent(db, schema, batch=2) == 5
    assert count(db, schema) == 2
    assert count(db, schema, "status = 'sent'") == 0


def test_relay_cleans_up_on_its_schedule_and_a_failing_cleanup_never_stops_it(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: Conn,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    table = f"{schema}.outbox"

    def age_sent(n: int) -> None:
        # One transaction: the relay never sees these rows pending.
        with db.transaction():
            for i in range(n):
                enqueue(db, topic, {"old": i}, schema=schema)
            db.execute(
                f"UPDATE {table} SET status = 'sent', sent_at = now() - interval '8 days'"
                " WHERE status = 'pending'"
            )

    # Given two sent rows past the retention, and a cleanup whose first run fails
    age_sent(2)
    runs: list[int] = []

    def flaky_delete_sent(*args: Any, **kwargs: Any) -> int:
        runs.append(len(runs))
        if len(runs) == 1:
            raise psycopg.errors.InsufficientPrivilege("permission denied for table outbox")
        return delete_sent(*args, **kwargs)

    monkeypatch.setattr("producer_outbox.group.delete_sent", flaky_delete_sent)
    with (
        caplog.at_level(logging.ERROR, logger="producer_outbox.schedule"),
        running_relay(stack, schema, cleanup_interval=0.5),
    ):
        # When the relay starts: its cleanup fails at once, is logged, and the relay publishes
        wait_for(lambda: runs != [], what="the first cleanup")
        fresh = enqueue(db, topic, {"n": "fresh"}, schema=schema)
        wait_for(lambda: count(db, schema, f"id = '{fresh}' AND status = 'sent'") == 1)
        # Then the next run, one interval later, deletes the old rows, and the one after
        # that deletes rows that aged since.
        wait_for(lambda: count(db, schema) == 1, what="old rows deleted")
        age_sent(1)
        wait_for(lambda: count(db, schema) == 1, what="newly aged row deleted")
    assert "upkeep task 'cleanup' failed" in caplog.text
    assert "permission denied" in caplog.text
    assert len(runs) >= 3
    assert [r.event_id for r in consume(stack, topic, 1, linger=1.0)] == [str(fresh)]
