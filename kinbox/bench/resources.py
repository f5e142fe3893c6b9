"""The benchmark's namespace on the target: topics, consumer groups, schemas under one prefix.

Everything the run creates is named ``<prefix>...``, so removing it afterwards
needs no bookkeeping that a crash could lose: :meth:`Namespace.remove` deletes
every topic and group whose name starts with the prefix and drops the
schemas — and, for the CDC contender, its connectors on Kafka Connect, their
replication slots and publications, and Debezium's heartbeat topics.
:func:`interruptible` turns SIGINT/SIGTERM into an exception, so the
``finally`` that calls it also runs when the user stops the run.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from kinbox.bench.spec import Target
from kinbox.core.errors import KinboxError

log = logging.getLogger(__name__)

PARTITIONS = 3
"""Partitions of every benchmark topic."""

HEARTBEAT_TOPIC_PREFIX = "__debezium-heartbeat"
"""Debezium's heartbeat topic is ``<this>.<topic.prefix>`` (its ``topic.heartbeat.prefix``)."""


class Interrupted(KinboxError, KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: stop, remove what was created, exit.

    Also a :class:`KeyboardInterrupt`, because that is what psycopg answers by
    cancelling the statement running on the server. Otherwise a long one (the
    large scenario's preload of 10M rows) would run on after the interrupt and
    hold the locks that the cleanup's ``DROP SCHEMA`` waits for.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


@contextmanager
def interruptible() -> Iterator[None]:
    """Raise :class:`Interrupted` in the main thread on the first SIGINT/SIGTERM.

    A second signal while cleaning up is ignored: the cleanup is what stops
    the benchmark from leaving topics and tables behind.
    """
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    fired = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal fired
        if fired:
            log.warning("%s: still removing the benchmark's topics and tables", signum)
            return
        fired = True
        raise Interrupted(signum)

    for signum in previous:
        signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Namespace:
    """Creates and removes the run's topics, schemas and groups on ``target``."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._admin = AdminClient(target.client_config())

    def topic(self, *parts: str) -> str:
        """The name of a topic of this run: ``<prefix>.<part>.<part>``."""
        return ".".join((self.target.prefix, *parts))

    def group(self, *parts: str) -> str:
        """The name of a consumer group of this run."""
        return ".".join((self.target.prefix, *parts))

    def schema(self, suffix: str = "") -> str:
        """A schema of this run (``<prefix>`` or ``<prefix>_<suffix>``)."""
        return f"{self.target.prefix}_{suffix}" if suffix else self.target.prefix

    def create_topic(
        self, name: str, partitions: int = PARTITIONS, config: dict[str, str] | None = None
    ) -> str:
        """Create ``name`` (replication: the cluster's default; ``config``: topic settings)."""
        futures = self._admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=-1, config=config or {})]
        )
        try:
            futures[name].result(60)
        except KafkaException as exc:
            raise KinboxError(f"cannot create topic {name!r}: {exc}") from exc
        return name

    def remove(self, timeout: float = 30.0) -> list[str]:
        """Delete every topic, group and schema of this run; return what could not be removed."""
        left: list[str] = []
        # Connectors before their slots (a live connector recreates its slot),
        # slots before the schemas (a slot holds WAL back for the whole server).
        left += self._remove_connectors()
        left += self._drop_slots()
        left += self._drop_schemas()
        left += self._delete_topics(timeout)
        left += self._delete_groups(timeout)
        return left

    def connector(self, *parts: str) -> str:
        """The name of a Kafka Connect connector of this run (also its Debezium topic prefix)."""
        return "-".join((self.target.prefix, *parts))

    def slot(self, *parts: str) -> str:
        """The name of a replication slot (and publication) of this run."""
        return "_".join((self.target.prefix, *parts))

    def _remove_connectors(self) -> list[str]:
        if not self.target.connect_url:
            return []
        from producer_outbox.connect_api import ConnectClient

        try:
            client = ConnectClient(self.target.connect_url)
            for name in client.names():
                if name.startswith(self.target.prefix + "-"):
                    client.delete(name)
        except KinboxError as exc:
            return [f"connectors {self.target.prefix}-*: {exc}"]
        return []

    def _drop_slots(self) -> list[str]:
        """Drop the run's replication slots and publications (a user's database too)."""
        from producer_outbox.slots import drop_slot

        pattern = self.target.prefix + "_"
        try:
            with psycopg.connect(self.target.database_url, autocommit=True) as conn:
                for (slot,) in conn.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE starts_with(slot_name, %s)",
                    (pattern,),
                ).fetchall():
                    drop_slot(conn, slot)
                for (publication,) in conn.execute(
                    "SELECT pubname FROM pg_publication WHERE starts_with(pubname, %s)", (pattern,)
                ).fetchall():
                    conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(publication)))
        except (psycopg.Error, KinboxError) as exc:
            return [f"replication slots {pattern}*: {exc}"]
        return []

    def _drop_schemas(self) -> list[str]:
        prefix = self.target.prefix
        try:
            with psycopg.connect(self.target.database_url, autocommit=True) as conn:
                names = [
                    row[0]
                    for row in conn.execute(
                        "SELECT nspname FROM pg_namespace WHERE nspname = %s"
                        " OR starts_with(nspname, %s)",
                        (prefix, prefix + "_"),
                    )
                ]
                for name in names:
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
        except psycopg.Error as exc:
            return [f"schemas {prefix}*: {exc}"]
        return []

    def _delete_topics(self, timeout: float) -> list[str]:
        try:
            # Debezium's heartbeat topic is named after the connector's topic prefix.
            heartbeats = f"{HEARTBEAT_TOPIC_PREFIX}.{self.target.prefix}-"
            topics = [
                t
                for t in self._admin.list_topics(timeout=timeout).topics
                if t.startswith((self.target.prefix + ".", heartbeats))
            ]
        except KafkaException as exc:
            return [f"topics {self.target.prefix}.*: {exc}"]
        if not topics:
            return []
        left = []
        for name, future in self._admin.delete_topics(topics, operation_timeout=timeout).items():
            try:
                future.result(timeout)
            except KafkaException as exc:
                left.append(f"topic {name}: {exc}")
        return left

    def _delete_groups(self, timeout: float) -> list[str]:
        """Delete the run's groups; a static member keeps its group busy until its session ends."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                listed = self._admin.list_consumer_groups().result(timeout)
            except KafkaException as exc:
                return [f"groups {self.target.prefix}.*: {exc}"]
            groups = [
                g.group_id
                for g in listed.valid
                if g.group_id and g.group_id.startswith(self.target.prefix + ".")
            ]
            if not groups:
                return []
            left = []
            for name, future in self._admin.delete_consumer_groups(groups).items():
                try:
                    future.result(timeout)
                except KafkaException as exc:
                    left.append(f"group {name}: {exc}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(1.0)
