"""Warming a freshly started broker before anything is measured on it.

The benchmarks' own broker runs the JVM's optimising compiler, as a
production broker does (:class:`~kinbox.devstack.kafka.KafkaBroker`'s
``quick_jit=False``). A fresh one spends its first minute or two under load
compiling: on two cores that is most of a core taken from whatever runs
first, and the contenders are not measured in the same order in every
scenario. So the harness drives the broker's request paths — produce,
fetch, offset commits, in large batches and one record at a time — until
that is done, before the first run.

It drives them on both kinds of topic the scenarios measure on (the
producer's timestamps, and the broker's append time that the latency and CDC
scenarios read), with records that carry a header as theirs do, from an
idempotent producer and from one with the latency feeder's plain profile:
the broker's append takes a branch of its own for the append time and for an
idempotent producer's batches, and a branch first taken during a measured
run is compiled during it.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections import Counter
from typing import Any

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaException,
    Producer,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kinbox.core.errors import KinboxError

SECONDS = 120.0
"""How long the warm-up drives the broker (by default)."""

STAMPED_BY = {TIMESTAMP_CREATE_TIME: "CreateTime", TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}
"""A consumed record's timestamp type, by the name its topic was created with."""

TIMESTAMPS = tuple(STAMPED_BY.values())
"""The topics' ``message.timestamp.type``: the producer's clock, and the broker's."""

HEADERS: list[tuple[str, str | bytes | None]] = [("event-id", b"warm-up")]
"""Every record's headers: the scenarios' records carry their event id in one."""


def warm(bootstrap_servers: str, seconds: float = SECONDS) -> Counter[str]:
    """Produce and consume on throwaway topics for ``seconds``.

    Returns:
        The records consumed, by their timestamp type (a :data:`TIMESTAMPS` name).

    Raises:
        KinboxError: a topic could not be created or a record was not
            acknowledged.
    """
    name = f"kinbox_warmup_{secrets.token_hex(4)}"
    topics = [f"{name}_{kind}" for kind in TIMESTAMPS]
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [
            NewTopic(topic, num_partitions=3, config={"message.timestamp.type": kind})
            for topic, kind in zip(topics, TIMESTAMPS, strict=True)
        ]
    )
    try:
        for topic, future in futures.items():
            try:
                future.result(60)
            except KafkaException as exc:
                raise KinboxError(f"warm-up: cannot create topic {topic!r}: {exc}") from exc
        return _drive(bootstrap_servers, name, topics, time.monotonic() + seconds)
    finally:
        # A topic never created cannot be deleted; nothing else is left behind.
        for future in admin.delete_topics(topics).values():
            with contextlib.suppress(KafkaException):
                future.result(60)


def _drive(bootstrap_servers: str, group: str, topics: list[str], until: float) -> Counter[str]:
    # Errors only: a broker this fresh answers "coordinator load in progress"
    # to the first requests, and the clients retry on their own.
    common: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "log_level": 3}
    # The bursts from an idempotent producer, the trickle from one with the
    # latency feeder's plain profile: the broker checks their batches apart.
    bursts = Producer({**common, "linger.ms": 0, "enable.idempotence": True, "acks": "all"})
    trickle = Producer({**common, "linger.ms": 0})
    # As the contenders consume: committed reads, a cooperative group.
    consumer = Consumer(
        {
            **common, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )  # fmt: skip
    consumer.subscribe(topics)
    moved: Counter[str] = Counter()
    value = b"x" * 200
    dot = time.monotonic()
    try:
        while time.monotonic() < until:
            # A burst (large produce requests and fetches), then a trickle
            # (one record a request, an offset commit each): both kinds of
            # request the scenarios make, to each kind of topic in turn.
            for topic in topics:
                for n in range(5_000):
                    _produce(bursts, topic, value, n)
                for n in range(200):
                    _produce(trickle, topic, value, n)
                    trickle.flush(10)
                if bursts.flush(60) or trickle.flush(60):
                    raise KinboxError("warm-up: records not acknowledged")
            _drain(consumer, 5_200 * len(topics), moved)
            if time.monotonic() - dot >= 10:
                dot = time.monotonic()
                print(".", end="", file=sys.stderr, flush=True)
    finally:
        consumer.close()
    print(file=sys.stderr)
    return moved


def _produce(producer: Producer, topic: str, value: bytes, n: int) -> None:
    while True:
        try:
            producer.produce(topic, value, key=str(n % 97).encode(), headers=HEADERS)
            return
        except BufferError:
            producer.poll(0.05)


def _drain(consumer: Consumer, records: int, moved: Counter[str]) -> None:
    """Consume ``records``, committing asynchronously after every poll; count them in ``moved``."""
    got = 0
    deadline = time.monotonic() + 60
    while got < records and time.monotonic() < deadline:
        batch = consumer.consume(500, 0.5)
        for message in batch:
            if message.error() is None:
                got += 1
                moved[STAMPED_BY[message.timestamp()[0]]] += 1
        if batch:
            consumer.commit(asynchronous=True)
