"""Warming a freshly started broker before anything is measured on it.

The benchmarks' own broker runs the JVM's optimising compiler, as a
production broker does (:class:`~kinbox.devstack.kafka.KafkaBroker`'s
``quick_jit=False``). A fresh one spends its first minute or two under load
compiling: on two cores that is most of a core taken from whatever runs
first, and the contenders are not measured in the same order in every
scenario. So the harness drives the broker's request paths — produce,
fetch, offset commits, in large batches and one record at a time — until
that is done, before the first run.
"""

from __future__ import annotations

import secrets
import sys
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kinbox.core.errors import KinboxError

SECONDS = 120.0
"""How long the warm-up drives the broker (by default)."""


def warm(bootstrap_servers: str, seconds: float = SECONDS) -> int:
    """Produce and consume on a throwaway topic for ``seconds``; return the records moved.

    Raises:
        KinboxError: the topic could not be created or a record was not
            acknowledged.
    """
    topic = f"kinbox_warmup_{secrets.token_hex(4)}"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3)])[topic].result(60)
    except KafkaException as exc:
        raise KinboxError(f"warm-up: cannot create topic {topic!r}: {exc}") from exc
    try:
        return _drive(bootstrap_servers, topic, time.monotonic() + seconds)
    finally:
        admin.delete_topics([topic])[topic].result(60)


def _drive(bootstrap_servers: str, topic: str, until: float) -> int:
    # Errors only: a broker this fresh answers "coordinator load in progress"
    # to the first requests, and the clients retry on their own.
    common: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "log_level": 3}
    producer = Producer({**common, "linger.ms": 0, "enable.idempotence": True, "acks": "all"})
    # As the contenders consume: committed reads, a cooperative group.
    consumer = Consumer(
        {
            **common, "group.id": topic, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )  # fmt: skip
    consumer.subscribe([topic])
    moved = 0
    value = b"x" * 200
    dot = time.monotonic()
    try:
        while time.monotonic() < until:
            # A burst (large produce requests and fetches), then a trickle
            # (one record a request, an offset commit each): both kinds of
            # request the scenarios make.
            for n in range(5_000):
                _produce(producer, topic, value, n)
            for n in range(200):
                _produce(producer, topic, value, n)
                producer.flush(10)
            if producer.flush(60):
                raise KinboxError("warm-up: records not acknowledged")
            moved += _drain(consumer, 5_200)
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
            producer.produce(topic, value, key=str(n % 97).encode())
            return
        except BufferError:
            producer.poll(0.05)


def _drain(consumer: Consumer, records: int) -> int:
    """Consume ``records``, committing asynchronously after every poll."""
    got = 0
    deadline = time.monotonic() + 60
    while got < records and time.monotonic() < deadline:
        batch = consumer.consume(500, 0.5)
        got += sum(1 for m in batch if m.error() is None)
        if batch:
            consumer.commit(asynchronous=True)
    return got
