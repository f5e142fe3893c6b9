"""kinbox inbox cleanup never deletes inside the dedup window the broker defines, unless forced.

Each guard against the real broker: a topic's retention.ms (and a topic that
keeps records forever), a lagging group's oldest unconsumed record, an old
dead letter still on the dead-letter topic. Rows are counted in PostgreSQL
after each run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from psycopg import sql

from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from tests.integration.ops_support import ROOT, topic_pair

DAY_MS = 86_400_000
Conn = psycopg.Connection[tuple[object, ...]]


def rows_aged(db: Conn, schema: str, group: str, topic: str, days: Sequence[float]) -> None:
    """One processed_events row of ``group`` per entry, processed that many days ago."""
    for n, age in enumerate(days):
        db.execute(
            sql.SQL(
                'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset",'
                " processed_at) VALUES (%s, %s, %s, 0, %s, now() - make_interval(secs => %s))"
            ).format(sql.Identifier(schema)),
            (group, f"{group}-{n}", topic, n, age * 86400),
        )


def sightings_aged(db: Conn, schema: str, group: str, days: Sequence[float]) -> None:
    """One reused_event_ids sighting of ``group`` per entry, seen that many days ago."""
    for n, age in enumerate(days):
        db.execute(
            sql.SQL(
                'INSERT INTO {}.reused_event_ids (consumer, event_id, topic, partition, "offset",'
                " payload_hash, first_topic, first_partition, first_offset, first_payload_hash,"
                " seen_at) VALUES (%s, %s, 't', 0, %s, 1, 't', 0, 0, 2,"
                " now() - make_interval(secs => %s))"
            ).format(sql.Identifier(schema)),
            (group, f"{group}-{n}", n, age * 86400),
        )


def sightings(db: Conn, schema: str, group: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.reused_event_ids WHERE consumer = %s").format(
        sql.Identifier(schema)
    )
    row = db.execute(query, (group,)).fetchone()
    assert row is not None
    return int(str(row[0]))


def left(db: Conn, schema: str, group: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.processed_events WHERE consumer = %s").format(
        sql.Identifier(schema)
    )
    row = db.execute(query, (group,)).fetchone()
    assert row is not None
    return int(str(row[0]))


def produce(bootstrap: str, topic: str, count: int, *, age_ms: int = 0) -> None:
    """``count`` records into partition 0, stamped ``age_ms`` in the past."""
    producer = Producer({"bootstrap.servers": bootstrap})
    stamp = int(time.time() * 1000) - age_ms
    for n in range(count):
        producer.produce(topic, b"{}", partition=0, timestamp=stamp,
                         headers=[("event-id", f"e{n}".encode())])  # fmt: skip
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Commit ``offset`` for ``group`` on partition 0, as a member that consumed up to it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def cleanup(stack: Stack, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinbox", "inbox", "cleanup", *args,
         "--database-url", stack.database_url, "--schema", schema,
         "--bootstrap-servers", stack.bootstrap_servers],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip


def test_the_topics_retention_is_kept_and_infinite_retention_only_forced(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a group that consumed all of a topic kept for 2 days, and one
    # that consumed all of a topic kept forever
    apply_migrations(stack.database_url, schema, [INBOX])
    two_days = topic_pair(stack.bootstrap_servers, config={"retention.ms": str(2 * DAY_MS)})
    forever = topic_pair(stack.bootstrap_servers, config={"retention.ms": "-1"})
    for topic in (two_days, forever):
        produce(stack.bootstrap_servers, topic, 2)
        commit(stack.bootstrap_servers, f"g-{topic}", topic, 2)
    rows_aged(db, schema, f"g-{two_days}", two_days, [0.5, 1.5, 2.5, 4])
    rows_aged(db, schema, f"g-{forever}", forever, [10, 400])
    sightings_aged(db, schema, f"g-{two_days}", [1, 4])
    short = ["--group", f"g-{two_days}"]

    # When asked to delete rows older than 1 day: refused, nothing deleted
    refused = cleanup(stack, schema, "--older-than", "1d", *short)
    assert refused.returncode == 8, refused.stderr
    assert f"topic-retention {two_days}: 2d 0h (retention.ms={2 * DAY_MS})" in refused.stdout
    assert "refusing: --older-than 1d is inside the dedup window" in refused.stderr
    assert left(db, schema, f"g-{two_days}") == 4

    # When asked for 3 days: a dry run counts, the real run deletes only those
    dry = cleanup(stack, schema, "--older-than", "3d", "--dry-run", *short)
    assert dry.returncode == 0, dry.stderr
    assert f"would delete 1 processed_events row(s) older than 3d (g-{two_days} 1)" in dry.stdout
    assert left(db, schema, f"g-{two_days}") == 4
    done = cleanup(stack, schema, "--older-than", "3d", "--batch-size", "1", *short)
    assert done.returncode == 0, done.stderr
    assert "deleted 1 processed_events row(s) older than 3d" in done.stdout
    assert left(db, schema, f"g-{two_days}") == 3
    assert sightings(db, schema, f"g-{two_days}") == 1  # the reused-id sighting as old went too

    # Then a topic kept forever refuses every age, and --force says what it risks
    endless = ["--group", f"g-{forever}"]
    assert cleanup(stack, schema, "--older-than", "300d", *endless).returncode == 8
    assert left(db, schema, f"g-{forever}") == 2
    forced = cleanup(stack, schema, "--older-than", "300d", "--force", *endless)
    assert forced.returncode == 0, forced.stderr
    assert "FORCED" in forced.stderr and "applied a second time" in forced.stderr
    assert left(db, schema, f"g-{forever}") == 1


def test_a_lagging_group_keeps_the_rows_of_its_oldest_unconsumed_record(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a group that consumed one of three records written 5 days ago
    # (the broker keeps them: they are in the active segment)
    apply_migrations(stack.database_url, schema, [INBOX])
    topic = topic_pair(stack.bootstrap_servers, config={"retention.ms": "3600000"})
    group = f"g-{topic}"
    produce(stack.bootstrap_servers, topic, 3, age_ms=5 * DAY_MS)
    commit(stack.bootstrap_servers, group, topic, 1)
    rows_aged(db, schema, group, topic, [4, 6])

    # When asked to delete rows older than 2 days: refused by the unconsumed records
    refused = cleanup(stack, schema, "--older-than", "2d")
    assert refused.returncode == 8, refused.stderr
    assert f"keep {group} unconsumed -: 5d 0h" in refused.stdout
    assert left(db, schema, group) == 2

    # Then once the group has caught up, the topic's own horizon (its oldest
    # record, 5 days old, still there) still keeps them; past it they go
    commit(stack.bootstrap_servers, group, topic, 3)
    caught_up = cleanup(stack, schema, "--older-than", "2d")
    assert caught_up.returncode == 8 and "unconsumed" not in caught_up.stdout
    assert "its oldest record is older still" in caught_up.stdout
    done = cleanup(stack, schema, "--older-than", "121h")
    assert done.returncode == 0, done.stderr
    assert left(db, schema, group) == 1


def test_an_old_dead_letter_keeps_the_rows_it_could_be_replayed_over(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a group up to date on a topic kept 1 hour, whose dead-letter topic
    # still holds a dead letter from 3 days ago
    apply_migrations(stack.database_url, schema, [INBOX])
    topic = topic_pair(stack.bootstrap_servers, config={"retention.ms": "3600000"})
    group = f"g-{topic}"
    produce(stack.bootstrap_servers, topic, 2)
    commit(stack.bootstrap_servers, group, topic, 2)
    produce(stack.bootstrap_servers, f"{topic}.dlq", 1, age_ms=3 * DAY_MS)
    rows_aged(db, schema, group, topic, [1, 2, 4])

    # When asked to delete rows older than 1 day: refused by the dead letter
    refused = cleanup(stack, schema, "--older-than", "1d")
    assert refused.returncode == 8, refused.stderr
    assert f"keep {group} dead-letter {topic}.dlq: 3d 0h" in refused.stdout
    assert f"dead-letter {topic}.dlq: its oldest dead letter may still be replayed" in (
        refused.stderr
    )
    assert left(db, schema, group) == 3

    # Then past the dead letter's age the old rows go
    done = cleanup(stack, schema, "--older-than", "73h")
    assert done.returncode == 0, done.stderr
    assert left(db, schema, group) == 2
