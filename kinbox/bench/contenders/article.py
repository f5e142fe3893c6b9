"""The article's design: per event a transaction, SELECT then INSERT, and an offset commit.

What the source article proposes and many teams ship: for every record,
BEGIN; ``SELECT EXISTS`` in the processed table; if absent, INSERT it and the
effect; COMMIT; then a synchronous offset commit. It pays a durable commit
and a broker round trip per event. (SELECT-then-INSERT also races when two
members briefly own a partition; here the unique key turns that race into an
error, which is counted as a duplicate, so the check can still hold.)
"""

from __future__ import annotations

from typing import Any

import psycopg
from confluent_kafka import Consumer
from psycopg import sql

from kinbox.bench import effects
from kinbox.bench.contenders.common import StopFlag, consumer_config, message_row
from kinbox.bench.spec import ChildSpec
from kinbox.core.failpoints import failpoint


def run(spec: ChildSpec) -> None:
    """Consume until SIGTERM."""
    stop = StopFlag()
    exists = sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM {}.processed_events WHERE consumer = %s AND event_id = %s)"
    ).format(sql.Identifier(spec.schema))
    record = sql.SQL(
        'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset")'
        " VALUES (%s, %s, %s, %s, %s)"
    ).format(sql.Identifier(spec.schema))
    effect = effects.insert_one(spec.schema, spec.table)
    consumer = Consumer(consumer_config(spec))
    consumer.subscribe([spec.topic])
    with psycopg.connect(spec.database_url) as conn:
        while not stop:
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            row: tuple[Any, ...] = message_row(msg)
            try:
                found = conn.execute(exists, (spec.group, row[0])).fetchone()
                if found is not None and not found[0]:
                    conn.execute(record, (spec.group, row[0], spec.topic, row[1], row[2]))
                    conn.execute(effect, row)
                conn.commit()
            except psycopg.errors.UniqueViolation:
                conn.rollback()  # another member got there between our SELECT and INSERT
            failpoint("after_db_commit")
            consumer.commit(message=msg, asynchronous=False)
    consumer.close()
