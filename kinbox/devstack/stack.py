"""Kafka + PostgreSQL together: one launcher for ``kinbox dev``, the tests and the benchmarks.

Each half is either started here (a :class:`KafkaBroker`, a
:class:`PostgresServer`) or taken from the environment when the user points at
existing services: ``KINBOX_TEST_BOOTSTRAP`` for Kafka, ``KINBOX_TEST_DATABASE_URL``
for PostgreSQL. With ``brokers=3`` Kafka is a cluster of three KRaft nodes
(:class:`KafkaCluster`: replication factor 3, ``min.insync.replicas=2``)
instead of the single node. With ``cdc=True`` a Kafka Connect worker with Debezium's
PostgreSQL connector (:class:`KafkaConnect`) joins them; it always runs here,
against whichever broker the stack uses. With ``schema_registry=True`` a schema
registry with Confluent's API (Apicurio Registry, :class:`SchemaRegistry`) runs too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from kinbox.devstack.cluster import KafkaCluster
from kinbox.devstack.connect import KafkaConnect
from kinbox.devstack.kafka import KafkaBroker
from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.registry import SchemaRegistry, start_registry

EXTERNAL_KAFKA_ENV = "KINBOX_TEST_BOOTSTRAP"
EXTERNAL_DATABASE_ENV = "KINBOX_TEST_DATABASE_URL"


@dataclass(frozen=True)
class Stack:
    """Addresses of a running Kafka and PostgreSQL, and the launched services if we own them."""

    bootstrap_servers: str
    database_url: str
    kafka: KafkaBroker | None
    postgres: PostgresServer | None
    connect: KafkaConnect | None = None
    registry: SchemaRegistry | None = None
    cluster: KafkaCluster | None = None
    """The Kafka nodes when the stack runs more than one (``kafka`` is then ``None``)."""

    @property
    def connect_url(self) -> str:
        """Kafka Connect's REST address (empty unless started with ``cdc=True``)."""
        return self.connect.rest_url if self.connect is not None else ""

    @property
    def schema_registry_url(self) -> str:
        """The schema registry's Confluent API (empty unless started with ``schema_registry``)."""
        return self.registry.url if self.registry is not None else ""

    def describe(self) -> str:
        """One line per service: what runs, which version, where."""
        if self.kafka is not None:
            kafka = (
                f"Apache Kafka {self.kafka.version} (JVM broker, KRaft, pid {self.kafka.pid}) "
                f"at {self.bootstrap_servers}"
            )
        elif self.cluster is not None:
            pids = ", ".join(f"node {n} pid {pid}" for n, pid in self.cluster.pids.items())
            kafka = (
                f"Apache Kafka {self.cluster.version} (JVM cluster of {len(self.cluster.nodes)} "
                f"KRaft nodes: {pids}) at {self.bootstrap_servers}"
            )
        else:
            kafka = f"Kafka at {self.bootstrap_servers} (external, {EXTERNAL_KAFKA_ENV})"
        if self.postgres is not None:
            postgres = (
                f"PostgreSQL {self.postgres.version} (pid {self.postgres.pid}, "
                f"fsync={'on' if self.postgres.fsync else 'off'}) at {self.database_url}"
            )
        else:
            postgres = f"PostgreSQL at {self.database_url} (external, {EXTERNAL_DATABASE_ENV})"
        lines = [kafka, postgres]
        if self.connect is not None:
            lines.append(
                f"Kafka Connect {self.connect.version} (distributed, pid {self.connect.pid}) with "
                f"Debezium {self.connect.debezium_version} at {self.connect.rest_url}"
            )
        if self.registry is not None:
            lines.append(
                f"Apicurio Registry {self.registry.version} (pid {self.registry.pid}), "
                f"Confluent API at {self.registry.url}"
            )
        return "\n".join(lines)


@contextmanager
def local_stack(
    *,
    fsync: bool = False,
    use_external: bool = True,
    cdc: bool = False,
    schema_registry: bool = False,
    brokers: int = 1,
    postgres_settings: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """Start (or find) Kafka and PostgreSQL; stop what was started on exit, even on errors.

    Args:
        fsync: durable PostgreSQL commits (benchmarks want this; tests do not).
        use_external: honour ``KINBOX_TEST_BOOTSTRAP`` / ``KINBOX_TEST_DATABASE_URL``.
        cdc: also start Kafka Connect with Debezium (stopped first on exit).
        schema_registry: also start a schema registry (Apicurio, Confluent's API).
        brokers: Kafka nodes to start: 1 (the default) or a replicated
            :class:`KafkaCluster` of that many.
        postgres_settings: server settings of a PostgreSQL started here
            (``{"track_commit_timestamp": "on"}``); an external one keeps its own.
    """
    external_kafka = os.environ.get(EXTERNAL_KAFKA_ENV) if use_external else None
    external_db = os.environ.get(EXTERNAL_DATABASE_ENV) if use_external else None
    with ExitStack() as cleanup:
        postgres: PostgresServer | None = None
        kafka: KafkaBroker | None = None
        cluster: KafkaCluster | None = None
        if not external_db:
            postgres = PostgresServer(fsync=fsync, settings=dict(postgres_settings or {}))
            cleanup.callback(postgres.close)
            postgres.start()
        if external_kafka:
            bootstrap_servers = external_kafka
        elif brokers > 1:
            cluster = KafkaCluster(brokers)
            cleanup.callback(cluster.close)
            bootstrap_servers = cluster.start().bootstrap_servers
        else:
            kafka = KafkaBroker()
            cleanup.callback(kafka.close)
            bootstrap_servers = kafka.start().bootstrap_servers
        connect: KafkaConnect | None = None
        if cdc:
            connect = start_connect(bootstrap_servers)
            cleanup.callback(connect.close)  # callbacks run in reverse: Connect goes first
        registry = start_registry() if schema_registry else None
        if registry is not None:
            cleanup.callback(registry.close)
        yield Stack(
            bootstrap_servers=bootstrap_servers,
            database_url=external_db or (postgres.url if postgres else ""),
            kafka=kafka,
            postgres=postgres,
            connect=connect,
            registry=registry,
            cluster=cluster,
        )


def start_connect(bootstrap_servers: str) -> KafkaConnect:
    """Start a Kafka Connect worker against ``bootstrap_servers``; close it if it cannot start."""
    connect = KafkaConnect(bootstrap_servers)
    try:
        connect.start()
    except BaseException:
        connect.close()
        raise
    return connect
