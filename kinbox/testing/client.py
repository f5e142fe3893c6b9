"""Test an app's handlers against the real inbox on a real PostgreSQL, with no Kafka.

:class:`InboxTestClient` hands records straight to the worker's own batch
code — :class:`~kinbox.apply.batch.BatchProcessor` over the worker's
:class:`~kinbox.store.awaiting.MixedInboxStore` (async handlers on its
``AsyncConnection`` s, as in the worker), the app's middleware around
them — so a test goes through the same claim, transaction, savepoints,
narrowing and dead-letter bookkeeping as production. Only the broker is
missing: the client places each message on a partition at the next offset,
and a :class:`~kinbox.testing.FakePublisher` takes the dead letters.

Failures are settled as the worker settles them, without the waiting
(:mod:`kinbox.testing.settle`): a handler that keeps raising is dead-lettered
on its ``max_attempts``-th try and :meth:`InboxTestClient.deliver` returns
that verdict, with every failed try in
:attr:`~kinbox.testing.DeliveryResult.retries`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event
from kinbox.core.names import sql_identifier
from kinbox.core.policy import RetryPolicy
from kinbox.core.record import Position, Record
from kinbox.core.transport import Partition
from kinbox.store.awaiting import MixedInboxStore
from kinbox.store.migrations import Component
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from kinbox.testing.messages import FRESH, Fresh, Headers, Message
from kinbox.testing.publisher import FakePublisher
from kinbox.testing.recorder import RecordingStore
from kinbox.testing.results import DeliveryResult
from kinbox.testing.settle import Settler

DEFAULT_GROUP = "kinbox-test"
"""The consumer group of an app that names none."""


class InboxTestClient:
    """Deliver messages to ``app``'s handlers through the real inbox code on PostgreSQL.

    Args:
        app: the handlers, their middleware and the app's own settings
            (``KINBOX_*`` environment variables are not read: a test sees
            the same settings on every machine).
        database_url: the PostgreSQL server to use.
        schema: where kinbox's tables go; migrated here, left in place on
            :meth:`close`. By default a unique schema, dropped on
            :meth:`close`, so tests never see each other's rows.
        group_id: the consumer group (the dedup scope); default: the app's,
            else ``kinbox-test``.
        partitions: how many partitions every topic has.
        max_attempts: tries before a failing event is dead-lettered
            (default: the app's setting; a handler's own wins over both).
        missing_id: ``dead-letter``, ``derive`` or ``fail`` (default: the app's).
        outbox: also migrate ``producer_outbox``'s tables into the schema,
            for handlers that enqueue events.
        outage_retries: outages (a failure that counts no try) tolerated per
            delivery before its records are reported ``failed``.

    Every connection the handlers get, and :meth:`connect`, has the search
    path ``<schema>, public``: tables a test creates without a schema name
    land in the client's schema and go with it, and a handler's unqualified
    table names find them there.
    """

    def __init__(
        self,
        app: App,
        database_url: str,
        *,
        schema: str | None = None,
        group_id: str | None = None,
        partitions: int = 1,
        max_attempts: int | None = None,
        missing_id: str | None = None,
        outbox: bool = False,
        outage_retries: int = 3,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions={partitions!r}: at least 1")
        self.schema = sql_identifier(
            schema or f"kinbox_test_{uuid.uuid4().hex[:12]}", setting="schema"
        )
        """The schema of kinbox's tables, first on the search path."""
        self._owns_schema = schema is None
        self.settings = app.settings(
            {
                "database_url": database_url,
                "schema": self.schema,
                "group_id": group_id or app.settings().group_id or DEFAULT_GROUP,
                "max_attempts": max_attempts,
                "missing_id": missing_id,
            }
        ).validate()
        """The resolved settings the client runs with."""
        self.conninfo = _with_search_path(database_url, self.schema)
        """``database_url`` with the client's search path: for a test's own connections."""
        self.partitions = partitions
        self.publisher = FakePublisher()
        """Takes the dead letters: :attr:`dead_letters` lists what it acknowledged."""
        self.results: list[DeliveryResult] = []
        """Every delivery's result, in order."""
        self._offsets: dict[Partition, int] = {}
        self._messages: dict[Position, Message] = {}
        components: list[Component] = [INBOX]
        if outbox:
            from producer_outbox.schema import OUTBOX

            components.append(OUTBOX)
        apply_migrations(database_url, self.schema, components)
        inner = MixedInboxStore(self.conninfo, schema=self.schema, consumer=self.settings.group_id)
        self.store = RecordingStore(inner)
        """The inbox store the batches go through (the real one, recorded)."""
        try:
            inner.open()
        except BaseException:
            self._drop()
            raise
        self._routes = app.routes
        self._processor = BatchProcessor(
            self._routes,
            self.store,
            self.settings.id_headers,
            publisher=self.publisher,
            consumer=self.settings.group_id,
            max_attempts=self.settings.max_attempts,
            missing_id=self.settings.missing_id,
            middleware=app.middleware,
            value_reader=_kafka_reader,
        )
        self._settler = Settler(
            self._processor,
            self.store,
            self.publisher,
            RetryPolicy(self.settings.retry_initial, self.settings.retry_max),
            outage_retries,
        )
        self._closed = False

    # delivering
    def deliver(
        self,
        topic: str,
        payload: object = None,
        *,
        id: str | Fresh | None = FRESH,
        key: bytes | str | None = None,
        headers: Headers = (),
        partition: int | None = None,
    ) -> DeliveryResult:
        """Deliver one message, as the only record of a poll; return its verdict.

        Args:
            topic: a topic the app handles.
            payload: see :class:`~kinbox.testing.Message`.
            id: the event id; a fresh one by default, ``None`` for none.
            key: the record key.
            headers: more headers.
            partition: see :class:`~kinbox.testing.Message`.

        Returns:
            The result after the retries the worker would make.
        """
        message = Message(topic, payload, key=key, headers=headers, partition=partition)
        if not isinstance(id, Fresh):
            message = dataclasses.replace(message, id=id)
        return self.deliver_message(message)

    def deliver_message(self, message: Message) -> DeliveryResult:
        """Deliver ``message`` as the only record of a poll; see :meth:`deliver`."""
        return self.deliver_batch([message])[0]

    def deliver_batch(self, messages: Iterable[Message]) -> list[DeliveryResult]:
        """Deliver ``messages`` as one poll: each partition's records form one batch.

        Each goes to its partition at the next offset there, in the order
        given, so messages with the same event id in one call show the
        claim's in-batch deduplication.

        Returns:
            The results, in the order of ``messages``.
        """
        records = [self._place(message) for message in messages]
        return self._run(records)

    def redeliver(self, delivered: DeliveryResult, *, new_offset: bool = False) -> DeliveryResult:
        """Deliver ``delivered``'s record again.

        Args:
            delivered: an earlier result of this client.
            new_offset: ``False``: the same record at the same offset, as a
                consumer reads it again after a crash before its offset
                commit, or a rebalance. ``True``: the same message published
                again (a producer retry, the outbox relay sending a row
                twice), at the next offset.
        """
        record = delivered.record
        if new_offset:
            return self.deliver_message(self._messages[record.position])
        return self._run([record])[0]

    @property
    def dead_letters(self) -> list[Record]:
        """Every dead letter the fake broker acknowledged, in order (repeats included)."""
        return list(self.publisher.acked)

    # the database
    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        """An autocommit connection with the client's search path, closed after the block."""
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            yield conn

    def execute(
        self,
        query: str | sql.SQL | sql.Composed,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit, the client's search path); return its rows, if any."""
        with self.connect() as conn:
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description is not None else []

    def processed_events(self) -> dict[str, str]:
        """The inbox's rows of this consumer group: event id -> status."""
        query = sql.SQL(
            "SELECT event_id, status FROM {}.processed_events WHERE consumer = %s"
        ).format(sql.Identifier(self.schema))
        with self.connect() as conn:
            rows = conn.execute(query, (self.settings.group_id,)).fetchall()
        return {str(event_id): str(status) for event_id, status in rows}

    def close(self) -> None:
        """Close the pool; drop the schema if the client made it (also what tests created there)."""
        if self._closed:
            return
        self._closed = True
        self.store.close()
        self._drop()

    def __enter__(self) -> InboxTestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the worker's loop, one delivery at a time
    def _place(self, message: Message) -> Record:
        if message.topic not in self._routes:
            raise ConfigurationError(
                f"the app has no handler for topic {message.topic!r}; "
                f"it handles {sorted(self._routes)}"
            )
        tp = (message.topic, message.partition_for(self.partitions))
        offset = self._offsets.get(tp, 0)
        self._offsets[tp] = offset + 1
        record = message.record(tp[1], offset, self.settings.id_headers[0])
        self._messages[record.position] = message
        return record

    def _run(self, records: list[Record]) -> list[DeliveryResult]:
        by_partition: dict[Partition, list[Record]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record)
        verdicts: dict[Position, DeliveryResult] = {}
        for tp, batch in by_partition.items():
            verdicts.update(self._settler.settle(tp, sorted(batch, key=lambda r: r.offset)))
        results = [verdicts[record.position] for record in records]
        self.results += results
        return results

    def _drop(self) -> None:
        if not self._owns_schema:
            return
        drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema))
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            conn.execute(drop)


def _with_search_path(database_url: str, schema: str) -> str:
    """``database_url`` whose sessions start with ``search_path = <schema>, public``."""
    params = conninfo_to_dict(database_url)
    # A validated identifier needs no quoting; the URL's own options are kept.
    options = f"{params.get('options') or ''} -c search_path={schema},public".strip()
    return make_conninfo("", **{**params, "options": options})


def _kafka_reader(deserializer: object) -> Callable[[Event], object]:
    """The Kafka driver's reader of a confluent-kafka deserializer's values, loaded when asked.

    Only a handler registered with such a deserializer asks, so the kit loads
    no Kafka client for any other.
    """
    from kinbox.kafka.serde import reader

    return reader(deserializer)
