"""``python -m kinbox.bench.feeder``: an external producer at a fixed rate, as a team's service.

The outside scenarios (:mod:`kinbox.bench.outside`) feed the contender from a
process of its own, a plain confluent-kafka ``Producer`` with the settings a
team would leave as they are: the profile ``plain`` sets ``linger.ms=0`` and
nothing else, ``idempotent`` adds ``enable.idempotence=true``. Each record
is one event (a random or time-ordered id in the ``event-id`` header), its
key one of ``keys`` values, its payload ``{"userId", "lessonId", "sentAt"}``,
``sentAt`` the wall clock when ``produce()`` was called.

Its clock starts once the producer is ready, as a service's long-lived
producer is: the topic's metadata is known and, for ``idempotent``, the
broker has given the producer its id. Until then an idempotent producer holds
every record back, and the first records of a run would wait for the
producer's start-up (hundreds of milliseconds), not for the consumer.

It paces by the clock, not by sleeping a fixed step: every wake-up produces
each record whose time has come, so a late wake-up never lowers the rate.

When it is done it writes, per acknowledged record, ``partition offset
appended`` (the broker's append time on a ``LogAppendTime`` topic, seconds
since the epoch; -1 otherwise) to ``out``, and its summary (:class:`Fed`)
as JSON to ``out.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message, Producer

from kinbox.bench.workload import ID_HEADER
from producer_outbox.ids import new_event_id

PROFILES: dict[str, dict[str, Any]] = {
    "plain": {"linger.ms": 0},
    "idempotent": {"linger.ms": 0, "enable.idempotence": True},
}
"""Producer settings by profile name: librdkafka's defaults but for these."""


@dataclass(frozen=True)
class FeedSpec:
    """What the feeder produces, where, how fast, for how long."""

    bootstrap_servers: str
    topic: str
    rate: float
    """Records per second."""
    seconds: float
    """How long to produce (``rate * seconds`` records)."""
    out: str
    """Where the per-record acknowledgements go."""
    profile: str = "plain"
    keys: int = 50
    ordered_ids: bool = False
    kafka: dict[str, str] = field(default_factory=dict)
    """``-X`` properties of the target (TLS, SASL...)."""

    ENV = "KINBOX_BENCH_FEED"

    def to_json(self) -> str:
        """Serialise for the feeder's environment."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FeedSpec:
        """Parse what :meth:`to_json` wrote."""
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Fed:
    """The feeder's summary."""

    records: int
    acknowledged: int
    errors: list[str]
    first_sent: float
    last_sent: float
    behind_max_ms: float
    """The most the producing loop fell behind its schedule (a saturated feeder says so)."""
    ready_ms: float = 0.0
    """How long the producer took to be ready, before the clock started."""


READY_WAIT = 30.0
"""Seconds the feeder waits at most for its producer to be ready."""

# How often an idempotent producer reports its statistics, where its id's
# state shows; librdkafka cannot stop them, so they go on, unread, all run.
_STATS_MS = 50


def _ready(producer: Producer, topic: str, assigned: threading.Event) -> None:
    """Wait until ``producer`` knows ``topic``'s leaders and, if idempotent, has its id.

    ``assigned`` is set by the statistics callback of an idempotent producer
    once ``eos.idemp_state`` is ``Assigned``; a plain producer's is set from
    the start.

    Raises:
        TimeoutError: not ready within :data:`READY_WAIT`.
    """
    deadline = time.monotonic() + READY_WAIT
    producer.list_topics(topic, timeout=READY_WAIT)
    while not assigned.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the producer got no producer id within {READY_WAIT:.0f} s")
        producer.poll(_STATS_MS / 1000)


def feed(spec: FeedSpec) -> Fed:
    """Produce ``spec.rate * spec.seconds`` records at ``spec.rate``; write the acknowledgements.

    Raises:
        KeyError: an unknown profile.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": spec.bootstrap_servers,
        **spec.kafka,
        **PROFILES[spec.profile],
        "log.connection.close": False,
    }
    assigned = threading.Event()
    if not config.get("enable.idempotence"):
        assigned.set()
    else:

        def stats(document: str) -> None:
            if not assigned.is_set():  # parsed only until then: the reports go on all run
                eos = json.loads(document).get("eos", {})
                if eos.get("idemp_state") == "Assigned":
                    assigned.set()

        config.update({"statistics.interval.ms": _STATS_MS, "stats_cb": stats})
    producer = Producer(config)
    created = time.monotonic()
    _ready(producer, spec.topic, assigned)
    ready_ms = round(1000 * (time.monotonic() - created), 1)
    acks: list[tuple[int, int, float]] = []
    errors: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err.str())
            return
        kind, ms = msg.timestamp()
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None  # acknowledged
        acks.append((partition, offset, ms / 1000 if kind == TIMESTAMP_LOG_APPEND_TIME else -1.0))

    total = round(spec.rate * spec.seconds)
    make_id = new_event_id if spec.ordered_ids else uuid.uuid4
    start = time.time()
    first = last = start
    behind = 0.0
    n = 0
    while n < total:
        now = time.time()
        due = min(total, int((now - start) * spec.rate) + 1)
        if due > n:
            behind = max(behind, now - (start + n / spec.rate))
        while n < due:
            sent = time.time()
            body = {"userId": f"u{n % 1000}", "lessonId": f"l{n}", "sentAt": sent}
            while True:
                try:
                    producer.produce(
                        spec.topic, json.dumps(body).encode(), key=f"k{n % spec.keys}".encode(),
                        headers=[(ID_HEADER, str(make_id()).encode())], on_delivery=delivered,
                    )  # fmt: skip
                    break
                except BufferError:
                    producer.poll(0.01)
            if n == 0:
                first = sent
            last = sent
            n += 1
        producer.poll(0)
        wait = start + n / spec.rate - time.time()
        if wait > 0:
            time.sleep(wait)
    producer.flush(120)
    with open(spec.out, "w") as out:
        out.writelines(f"{p} {o} {a:.6f}\n" for p, o, a in acks)
    return Fed(total, len(acks), errors[:5], first, last, round(1000 * behind, 1), ready_ms)


def main() -> None:
    """Read the spec from the environment, feed, write the summary; exit 1 if a record failed."""
    spec = FeedSpec.from_json(os.environ[FeedSpec.ENV])
    fed = feed(spec)
    with open(f"{spec.out}.json", "w") as out:
        json.dump(asdict(fed), out)
    sys.exit(0 if fed.acknowledged == fed.records and not fed.errors else 1)


if __name__ == "__main__":
    main()
