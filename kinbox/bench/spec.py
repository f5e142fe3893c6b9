"""What a benchmark run is about, as plain data: the target, the sizes, a child's orders.

A leaf module: every stage of the harness imports it, it imports none of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kinbox.core.errors import ConfigurationError

PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9_]{2,39}$")
"""A namespace prefix: legal both as a PostgreSQL identifier and inside a topic name."""

CONNECT_URL_PATTERN = re.compile(r"^https?://[^/\s]+(/\S*)?$")
"""Kafka Connect's REST address."""

# librdkafka properties of a consumer only; a producer or admin client given
# them would log a warning for each.
CONSUMER_ONLY = ("group.", "session.", "heartbeat.", "max.poll.", "auto.", "enable.auto",
                 "partition.assignment", "isolation.", "fetch.", "queued.")  # fmt: skip


@dataclass(frozen=True)
class Target:
    """Where the benchmark runs, and the names it may create there.

    Args:
        bootstrap_servers: the Kafka cluster.
        database_url: the PostgreSQL database (the user needs CREATE on it).
        kafka: ``-X`` librdkafka properties for every client (TLS, SASL...).
        prefix: every topic, consumer group and schema the run creates starts
            with it; all of them are removed at the end.
        kafka_version: the broker's version when known (brokers do not tell
            clients their version; the local stack knows what it started).
        connect_url: a Kafka Connect REST address with Debezium's PostgreSQL
            connector, for the outbox scenario's CDC contender (none: it is
            skipped, and the report says so).
        connect_database_address: ``host[:port]`` of PostgreSQL as Connect
            reaches it, when that differs from ``database_url``'s.
    """

    bootstrap_servers: str
    database_url: str
    prefix: str
    kafka: Mapping[str, str] = field(default_factory=dict)
    kafka_version: str | None = None
    connect_url: str | None = None
    connect_database_address: str | None = None

    def __post_init__(self) -> None:
        if not PREFIX_PATTERN.match(self.prefix):
            raise ConfigurationError(
                f"prefix={self.prefix!r} is not allowed: 3-40 characters of a-z, 0-9 and _, "
                "starting with a letter (it names a schema and prefixes topics)"
            )
        if self.connect_url is not None and not CONNECT_URL_PATTERN.match(self.connect_url):
            raise ConfigurationError(
                f"connect_url={self.connect_url!r} is not allowed: Kafka Connect's REST "
                "address, http(s)://host:port"
            )

    @property
    def schema(self) -> str:
        """The schema holding the kinbox tables and the contenders' effect tables."""
        return self.prefix

    def client_config(self, *, consumer: bool = False) -> dict[str, Any]:
        """``bootstrap.servers`` plus the ``-X`` properties fit for this kind of client."""
        extra = {k: v for k, v in self.kafka.items() if consumer or not k.startswith(CONSUMER_ONLY)}
        return {"bootstrap.servers": self.bootstrap_servers, **extra}


EVENT_IDS = ("random", "time-ordered")
"""What :attr:`Sizes.event_ids` may be."""

PRODUCER_PROFILES = ("plain", "idempotent")
"""What :attr:`Sizes.latency_producers` may hold (:data:`kinbox.bench.feeder.PROFILES`)."""


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario does; :meth:`quick` and :meth:`long` scale it."""

    events: int = 30_000
    """Events per run for the fast contenders (kinbox, the set-based ceiling)."""
    repeat: int = 3
    """Runs of every contender in every throughput scenario (median and spread)."""
    kills: int = 3
    """Consumer redelivery: SIGKILLs between database commit and offset commit, per run."""
    large_rows: int = 10_000_000
    """Rows loaded into ``processed_events`` before the large-table scenario."""
    latency_rates: tuple[int, ...] = (1_000, 5_000)
    """Offered loads of the latency scenario, events/s (see :func:`kinbox.bench.outside.offers`)."""
    latency_producers: tuple[str, ...] = ("plain", "idempotent")
    """The feeding producer's profiles (:data:`kinbox.bench.feeder.PROFILES`)."""
    latency_seconds: float = 180.0
    """How long each latency run offers its load; all of it is measured."""
    latency_window: float = 10.0
    """Seconds per window of the latency's per-window percentiles."""
    stage_every: int = 100
    """The latency scenario's kinbox worker stamps the stages of 1 event in this many (0: none)."""
    backlog_events: int = 300_000
    """The memory scenario's backlog of 1 KB events."""
    outbox_rows: int = 100_000
    """The relay's backlog, written by SQL before the relay starts."""
    outbox_samples: int = 200
    """Outbox commits timed one by one, woken by NOTIFY (and through Debezium).

    Forty gave a p99 that was the slowest sample or next to it; with 200 it
    lies between the second and third slowest.
    """
    outbox_polling_samples: int = 40
    """The same, with no NOTIFY: each waits for the relay's poll interval."""
    outbox_sql_rate: float = 10.0
    """Rows a second a plain SQL writer commits while the relay runs (timed one by one)."""
    outbox_sql_seconds: float = 30.0
    """How long that writer writes."""
    outbox_trigger_statements: int = 2_000
    """INSERTs timed with and without the outbox's NOTIFY trigger (single-row; a tenth of
    them of 100 rows each)."""
    slow_events: int = 10_000
    """The slow-keys scenario's records, all in one partition."""
    slow_keys: int = 1_000
    """Distinct record keys among them."""
    key_concurrency: int = 16
    """Keys applied at once in slow-keys: kinbox's ``concurrency``, parallel-consumer's
    ``maxConcurrency`` (each with a database connection per key in flight)."""
    min_events: int = 60
    """No run gets fewer events than this, whatever a contender's scale."""
    event_ids: str = "random"
    """The workloads' event ids: ``random`` (version-4 UUIDs) or ``time-ordered`` (version 7).

    Random is the costly case for every inbox (each claim lands on its own
    page of ``processed_events``' index); ``producer_outbox`` makes
    time-ordered ones.
    """

    def __post_init__(self) -> None:
        if self.event_ids not in EVENT_IDS:
            raise ConfigurationError(f"event_ids={self.event_ids!r}: one of {', '.join(EVENT_IDS)}")
        unknown = [p for p in self.latency_producers if p not in PRODUCER_PROFILES]
        if unknown:
            raise ConfigurationError(
                f"latency_producers={unknown!r}: each one of {', '.join(PRODUCER_PROFILES)}"
            )

    @property
    def ordered_ids(self) -> bool:
        """Whether the workloads' event ids are time-ordered."""
        return self.event_ids == "time-ordered"

    @classmethod
    def quick(cls) -> Sizes:
        """Seconds per run: proves every contender and scenario runs; no figure to quote."""
        return cls(
            events=300, repeat=1, kills=2, large_rows=20_000, latency_rates=(200, 400),
            latency_seconds=2.0, latency_window=1.0, stage_every=1, backlog_events=600,
            outbox_rows=300, outbox_samples=5, outbox_polling_samples=5, outbox_sql_rate=10.0,
            outbox_sql_seconds=0.5, outbox_trigger_statements=20, slow_events=200,
            slow_keys=20, min_events=30,
        )  # fmt: skip

    def long(self) -> Sizes:
        """The long mode: 100M rows in ``processed_events``."""
        return replace(self, large_rows=100_000_000)

    def scaled(self, scale: float) -> int:
        """Events for a contender that gets ``scale`` of :attr:`events`."""
        return max(self.min_events, round(self.events * scale))


@dataclass(frozen=True)
class ChildSpec:
    """Everything a contender's consumer process needs, passed as JSON in its environment."""

    contender: str
    entry: str
    """``module:function`` that runs the contender, given this spec."""
    bootstrap_servers: str
    database_url: str
    group: str
    topic: str
    schema: str
    table: str
    kafka: dict[str, str] = field(default_factory=dict)
    """librdkafka properties for the consumer (``-X``, static membership...)."""
    extra: dict[str, str] = field(default_factory=dict)
    """A scenario's own orders (slow-keys: the handler's wait, the key concurrency...)."""

    ENV = "KINBOX_BENCH_SPEC"

    def to_json(self) -> str:
        """Serialise for the child's environment."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        """Parse what :meth:`to_json` wrote."""
        return cls(**json.loads(text))
