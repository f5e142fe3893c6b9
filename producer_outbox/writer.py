"""Write an event into the outbox inside the caller's transaction.

``enqueue`` is one ``INSERT``: the row takes effect at the caller's COMMIT
and vanishes with a ROLLBACK. The outbox's ``outbox_notify`` trigger wakes
the relay in the same transaction (:mod:`producer_outbox.schema`, step 6),
for this INSERT as for any other writer's, so a rolled-back business
transaction leaves no row and wakes no relay, and enqueueing many events in
a transaction costs one wake-up.

When a span is current, the row also stores its W3C trace context
(``traceparent``, ``tracestate``; :mod:`producer_outbox.trace_context`), so
the relay and the consumer continue the business transaction's trace.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Generator, Mapping
from typing import Any, cast

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from kinbox.core.cause import current as current_cause
from kinbox.core.errors import ConfigurationError, PayloadError
from kinbox.core.names import sql_identifier, topic_name
from kinbox.store.errors import translate
from producer_outbox import trace_context
from producer_outbox.debezium import CDC_CONSTRAINT
from producer_outbox.ids import new_event_id

# The notification comes from the table's trigger, in the same statement.
_INSERT = (
    "INSERT INTO {}.outbox"
    " (id, topic, aggregatetype, aggregateid, type, payload, payload_bytes, headers{})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s{}) RETURNING id"
)
_CAUSE_COLUMNS = sql.SQL(", caused_by_consumer, caused_by_event_id")
_CAUSE_VALUES = sql.SQL(", %s, %s")

#: Header names the relay sets itself; a stored header may not shadow them.
RESERVED_HEADERS = frozenset(
    {"event-id", "ce_id", "ce_type", "ce_source", "ce_specversion", *trace_context.COLUMNS.values()}
)

_TRACE_COLUMNS = sql.SQL(", traceparent, tracestate")
_TRACE_VALUES = sql.SQL(", %s, %s")

_MAX_KEY_BYTES = 1024
# json.dumps writes U+0000 as the escape \u0000 (after an even number of backslashes).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode_payload(payload: object) -> tuple[Jsonb | None, bytes | None]:
    """Return ``(json, raw)``: exactly one is set, the columns ``payload`` / ``payload_bytes``.

    Raises:
        PayloadError: the payload is neither bytes nor strictly JSON-serialisable
            (NaN and infinities are not JSON either).
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        return None, bytes(payload)
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"outbox payload of type {type(payload).__name__} is not JSON-serialisable "
            f"and not bytes: {exc}"
        ) from exc
    if _NUL_ESCAPE.search(text):
        # jsonb cannot hold U+0000; say so now rather than fail inside the INSERT.
        raise PayloadError("outbox payload contains U+0000, which PostgreSQL jsonb cannot store")
    # Dump once more through Jsonb with the checked text, not the object.
    return Jsonb(payload, dumps=lambda _obj: text), None


def check_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Return ``headers`` as a plain dict of text, refusing reserved or non-text entries.

    Raises:
        PayloadError: a name or value is not ``str``.
        ConfigurationError: a name is one the relay sets itself.
    """
    if headers is None:
        return {}
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise PayloadError(f"outbox header {name!r}={value!r}: names and values must be str")
        if name in RESERVED_HEADERS:
            raise ConfigurationError(
                f"outbox header {name!r} is set by the relay; reserved: {sorted(RESERVED_HEADERS)}"
            )
        checked[name] = value
    return checked


# (host, port, database, schema, columns) -> whether its outbox has those columns.
_COLUMNS_FOUND: dict[tuple[str, int, str, str, tuple[str, ...]], bool] = {}
_CAUSE_NAMES = ("caused_by_consumer", "caused_by_event_id")
_TRACE_NAMES = tuple(trace_context.COLUMNS)


# One step of an enqueue: a statement and its parameters. The driver runs it
# and sends back its first row, or throws the psycopg error back in.
_Step = tuple[sql.SQL | sql.Composed | str, tuple[Any, ...]]
_Steps = Generator[_Step, tuple[Any, ...] | None, uuid.UUID]
_Connection = psycopg.Connection[Any] | psycopg.Cursor[Any]
_AsyncConnection = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]
_Link = Callable[[], psycopg.Connection[Any] | psycopg.AsyncConnection[Any]]
"""The connection under what the caller passed (a cursor's), asked only when needed."""


def _has_columns(
    link: _Link, schema: str, names: tuple[str, ...]
) -> Generator[_Step, tuple[Any, ...] | None, bool]:
    """Whether the outbox in ``schema`` has every column of ``names`` (asked once per process).

    What those columns hold (the trace context, the inbox event that caused
    the row) is bookkeeping and must never fail an enqueue: an outbox not yet
    migrated (new code deployed before ``kinbox migrate``) simply records none.
    """
    info = link().info
    where = (info.host, info.port, info.dbname, schema, names)
    found = _COLUMNS_FOUND.get(where)
    if found is None:
        row = yield (
            "SELECT count(*) = %s FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attname = ANY(%s) AND NOT attisdropped",
            (len(names), f"{sql_identifier(schema, setting='schema')}.outbox", list(names)),
        )
        found = _COLUMNS_FOUND[where] = bool(row and row[0])
    return found


def enqueue(
    conn: _Connection,
    topic: str,
    payload: object,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    event_id: uuid.UUID | None = None,
    event_type: str | None = None,
    schema: str = "kinbox",
) -> uuid.UUID:
    """Add an event to the outbox in the transaction of ``conn``; return its event id.

    Nothing is published before the caller commits; a rollback discards the
    event. Called from a kinbox handler, the row also records which inbox
    event it was enqueued for (``caused_by_consumer``, ``caused_by_event_id``;
    see :mod:`kinbox.core.cause`), which ``kinbox explain`` shows.

    Rows of one ``key`` go to one partition, in ``(txid, seq)`` order:
    one transaction's in the order it enqueued them; across transactions, in
    the order they got their transaction ids (their first write), which is
    commit order when writers of the key take ``SELECT … FOR UPDATE`` on the
    aggregate (or an advisory lock) first (see :mod:`producer_outbox.relay`).

    Args:
        conn: the caller's connection or cursor, inside its transaction.
        topic: the Kafka topic to publish to.
        payload: a JSON-serialisable object (published as UTF-8 JSON text) or
            ``bytes`` (published unchanged; relay only: an outbox published by
            Debezium refuses them with :class:`PayloadError`).
        key: the partition key (Kafka record key); ``None`` for no key and no
            ordering between such events.
        headers: extra record headers, text only.
        event_id: the event id (``event-id`` header); by default a fresh
            time-ordered UUID (version 7, :mod:`producer_outbox.ids`), which
            keeps the outbox's and every consumer's inbox index inserts on
            their newest pages.
        event_type: stored in ``type``; when given the relay also sets the
            CloudEvents ``ce_*`` headers.
        schema: the kinbox schema holding the outbox.

    Raises:
        ConfigurationError: bad topic, schema, key or reserved header name.
        PayloadError: the payload or a header cannot be serialised, or the
            payload is bytes and the outbox is published by CDC.
        StoreError: the INSERT failed. ``transient`` when running the
            transaction again may succeed (the connection lost, a lock or
            statement timeout; a deadlock is a ``ConflictError``), not for a
            missing outbox table or an event id enqueued before.
    """

    def link() -> psycopg.Connection[Any]:
        return conn.connection if isinstance(conn, psycopg.Cursor) else conn

    steps = _Stepper(_enqueue(link, topic, payload, key, headers, event_id, event_type, schema))
    while (step := steps.next()) is not None:
        try:
            steps.answer(conn.execute(*step).fetchone())
        except psycopg.Error as exc:
            steps.fail(exc)
    return steps.result


async def enqueue_async(
    conn: _AsyncConnection,
    topic: str,
    payload: object,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
    event_id: uuid.UUID | None = None,
    event_type: str | None = None,
    schema: str = "kinbox",
) -> uuid.UUID:
    """:func:`enqueue` on a psycopg ``AsyncConnection`` (or ``AsyncCursor``), for asyncio services.

    The same row, checks and errors as :func:`enqueue`: both drive one
    sequence of steps (:func:`_enqueue`), one awaiting each statement.
    """

    def link() -> psycopg.AsyncConnection[Any]:
        return conn.connection if isinstance(conn, psycopg.AsyncCursor) else conn

    steps = _Stepper(_enqueue(link, topic, payload, key, headers, event_id, event_type, schema))
    while (step := steps.next()) is not None:
        try:
            steps.answer(await (await conn.execute(*step)).fetchone())
        except psycopg.Error as exc:
            steps.fail(exc)
    return steps.result


class _Stepper:
    """Drives :func:`_enqueue`'s steps for a driver: the next statement, then its answer."""

    def __init__(self, steps: _Steps) -> None:
        self._steps = steps
        self._row: tuple[Any, ...] | None = None
        self._failure: psycopg.Error | None = None
        self.result: uuid.UUID = uuid.UUID(int=0)
        """The event id, once :meth:`next` returned ``None``."""

    def next(self) -> _Step | None:
        """The next statement to run, with the last answer sent in; ``None`` when done."""
        row, failure = self._row, self._failure
        self._row, self._failure = None, None
        try:
            return self._steps.send(row) if failure is None else self._steps.throw(failure)
        except StopIteration as done:
            self.result = cast(uuid.UUID, done.value)
            return None

    def answer(self, row: tuple[Any, ...] | None) -> None:
        """The statement's first row."""
        self._row = row

    def fail(self, exc: psycopg.Error) -> None:
        """The statement failed: the steps translate ``exc`` (or let it through)."""
        self._failure = exc


def _enqueue(
    link: _Link,
    topic: str,
    payload: object,
    key: str | None,
    headers: Mapping[str, str] | None,
    event_id: uuid.UUID | None,
    event_type: str | None,
    schema: str,
) -> _Steps:
    """The steps of one enqueue, without I/O: the sync and async drivers run them.

    ``link`` is asked only when an optional column must be looked up, or
    when the INSERT failed: whose fault that was is judged as kinbox judges
    its own statements (:func:`kinbox.store.errors.blame`), so ``transient``
    means the same here as anywhere in kinbox.
    """
    topic_name(topic)
    schema_id = sql.Identifier(sql_identifier(schema, setting="schema"))
    if key is not None and (
        not isinstance(key, str) or len(key.encode("utf-8", "surrogatepass")) > _MAX_KEY_BYTES
    ):
        raise ConfigurationError(
            f"outbox key={key!r}: must be str of at most {_MAX_KEY_BYTES} bytes, or None"
        )
    json_payload, raw_payload = encode_payload(payload)
    stored_headers = check_headers(headers)
    event_id = event_id if event_id is not None else new_event_id()
    if not isinstance(event_id, uuid.UUID):
        raise ConfigurationError(f"outbox event_id={event_id!r}: must be a uuid.UUID")
    params: tuple[Any, ...] = (
        event_id,
        topic,
        topic,
        key,
        event_type,
        json_payload,
        raw_payload,
        Jsonb(stored_headers),
    )
    # The optional columns are named only when there is something to store,
    # so a plain, untraced producer's INSERT is the one it always was: the
    # trace context current at enqueue, and, inside a kinbox handler, which
    # inbox event this row is for.
    columns: list[sql.Composable] = []
    values: list[sql.Composable] = []
    try:
        traced = trace_context.current()
        if traced is not None and (yield from _has_columns(link, schema, _TRACE_NAMES)):
            columns.append(_TRACE_COLUMNS)
            values.append(_TRACE_VALUES)
            params += traced
        cause = current_cause()
        if cause is not None and (yield from _has_columns(link, schema, _CAUSE_NAMES)):
            columns.append(_CAUSE_COLUMNS)
            values.append(_CAUSE_VALUES)
            params += (cause.consumer, cause.event_id)
        yield (
            sql.SQL(_INSERT).format(schema_id, sql.Composed(columns), sql.Composed(values)),
            params,
        )
    except psycopg.Error as exc:
        if isinstance(exc, psycopg.errors.CheckViolation) and (
            exc.diag.constraint_name == CDC_CONSTRAINT
        ):
            raise PayloadError(
                f"cannot enqueue event {event_id} for topic {topic!r}: the outbox in schema "
                f"{schema!r} is published by Debezium (CDC), which routes JSON payloads only; "
                "bytes payloads need the relay (see `kinbox outbox debezium-config`)"
            ) from exc
        doing = f"cannot enqueue event {event_id} for topic {topic!r} in schema {schema!r}"
        raise translate(exc, link(), doing=doing) from exc
    return event_id
