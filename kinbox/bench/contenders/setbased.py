"""The hand-written set-based consumer: the practical ceiling, no framework.

What a strong engineer writes by hand for throughput: consume up to 500
records, then per partition one transaction with one set-based claim
statement and one set-based effect insert, then one synchronous offset
commit for the whole poll. Everything happens on the polling thread, one
step after the other: it waits for each commit's fsync and for the offset
commit before it fetches again.

:func:`run_streaming_each` is the same streaming inbox with a per-event
effect: one ``INSERT`` per event, pipelined, as a per-event handler writes
it. It is what a per-event handler costs with no framework around it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from kinbox.bench import effects
from kinbox.bench.contenders.common import (
    StopFlag,
    claim_many,
    columns,
    consumer_config,
    message_row,
)
from kinbox.bench.spec import ChildSpec
from kinbox.core.failpoints import failpoint

BATCH = 500
WAIT = 0.1
"""Seconds ``consume`` waits to fill a batch (kinbox's default ``batch_max_wait``)."""


def run(spec: ChildSpec) -> None:
    """Consume until SIGTERM: wait to fill a batch, commit its offsets synchronously."""
    _consume(spec, lambda consumer: consumer.consume(BATCH, WAIT), asynchronous=False)


def run_streaming(spec: ChildSpec) -> None:
    """Consume until SIGTERM: wait for one record only, commit offsets asynchronously.

    One commit is in flight at a time, and the next carries the latest
    offsets: a Kafka 4 group coordinator answers a member's commits one at
    a time, each after its append linger, and a commit per poll at 1,000
    events/s queues them until the member's heartbeats time out behind
    them (the same pacing kinbox's worker uses).
    """
    _consume(spec, _streaming, asynchronous=True)


def run_streaming_each(spec: ChildSpec) -> None:
    """:func:`run_streaming` with one ``INSERT`` per event, pipelined (no set-based effect).

    Each event's statement is ``conn.execute`` on the transaction's
    connection, as a per-event handler's is; more than one go out in one
    pipeline, as kinbox sends a batch's.
    """
    insert = effects.insert_one(spec.schema, spec.table)

    def each(conn: psycopg.Connection[Any], todo: list[tuple[Any, ...]]) -> None:
        if len(todo) == 1:
            conn.execute(insert, todo[0])
            return
        with conn.pipeline():
            for row in todo:
                conn.execute(insert, row)

    _consume(spec, _streaming, asynchronous=True, effect=each)


def _streaming(consumer: Consumer) -> list[Message]:
    first = consumer.consume(1, WAIT)
    return first + consumer.consume(BATCH - 1, 0) if first else first


Effect = Callable[[psycopg.Connection[Any], list[tuple[Any, ...]]], None]
"""Writes the fresh events' effect rows in the open transaction."""


def _set_based(spec: ChildSpec) -> Effect:
    insert = effects.insert_many(spec.schema, spec.table)

    def write(conn: psycopg.Connection[Any], todo: list[tuple[Any, ...]]) -> None:
        conn.execute(insert, columns(todo))

    return write


def _consume(
    spec: ChildSpec,
    poll: Callable[[Consumer], list[Message]],
    *,
    asynchronous: bool,
    effect: Effect | None = None,
) -> None:
    stop = StopFlag()
    claim = claim_many(spec.schema)
    write = effect or _set_based(spec)
    due: dict[int, int] = {}  # settled, not yet sent (asynchronous commits only)
    answered = [True]  # no asynchronous commit waits for its answer

    def on_commit(_error: object, _partitions: object) -> None:
        answered[0] = True

    consumer = Consumer({**consumer_config(spec), "on_commit": on_commit})
    consumer.subscribe([spec.topic])
    with psycopg.connect(spec.database_url) as conn:
        while not stop:
            if due and answered[0]:
                sent = [TopicPartition(spec.topic, p, o) for p, o in due.items()]
                consumer.commit(offsets=sent, asynchronous=True)
                due.clear()
                answered[0] = False
            messages = [m for m in poll(consumer) if not m.error()]
            if not messages:
                continue
            by_partition: dict[int, list[tuple[Any, ...]]] = {}
            for msg in messages:
                by_partition.setdefault(int(msg.partition() or 0), []).append(message_row(msg))
            ends = []
            for partition, rows in by_partition.items():
                first: dict[str, tuple[Any, ...]] = {}
                for row in rows:
                    first.setdefault(row[0], row)  # a producer duplicate within the batch
                unique = list(first.values())
                with conn.transaction():
                    fresh = {
                        r[0]
                        for r in conn.execute(
                            claim,
                            (spec.group, [r[0] for r in unique], [spec.topic] * len(unique),
                             [r[1] for r in unique], [r[2] for r in unique]),
                        ).fetchall()
                    }  # fmt: skip
                    todo = [r for r in unique if r[0] in fresh]
                    if todo:
                        write(conn, todo)
                failpoint("after_db_commit")
                ends.append(TopicPartition(spec.topic, partition, rows[-1][2] + 1))
            if asynchronous:
                due.update((tp.partition, tp.offset) for tp in ends)
            else:
                consumer.commit(offsets=ends, asynchronous=False)
    if asynchronous:
        # What the last asynchronous commits sent may not have landed yet.
        with contextlib.suppress(KafkaException):
            consumer.commit(asynchronous=False)
    consumer.close()
