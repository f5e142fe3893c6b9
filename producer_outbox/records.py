"""Outbox rows and the Kafka records made from them (pure, no I/O)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from kinbox.core.publisher import OutgoingRecord
from producer_outbox.trace_context import headers as trace_headers

#: CloudEvents spec version announced in ``ce_specversion``.
CE_SPECVERSION = "1.0"


class OutboxRow(NamedTuple):
    """One claimed row of ``<schema>.outbox`` (immutable).

    A named tuple rather than a frozen dataclass: the relay builds one for
    every row it publishes, and a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) was an eighth of the relay's Python time.
    """

    id: str
    """The row's id (a uuid) in its text form: the record's ``event-id``."""
    seq: int
    topic: str
    key: str | None
    event_type: str | None
    value: bytes
    headers: dict[str, str]
    attempts: int
    traceparent: str | None = None
    """The W3C trace context stored by ``enqueue``, if a span was current then."""
    tracestate: str | None = None
    lane: int = 0
    """The lane the claim found it in (:mod:`producer_outbox.lane_locks`)."""


_new_tuple = tuple.__new__
"""Builds a named tuple from a tuple of every field, without its generated ``__new__``."""


def row_from_db(values: tuple[Any, ...]) -> OutboxRow:
    """Build an :class:`OutboxRow` from ``claim``'s column order (trace context, then lane)."""
    lane = 0
    if len(values) >= 11:
        id_, seq, topic, key, event_type, text, raw, headers, attempts, parent, state = values[:11]
        if len(values) > 11:
            lane = values[11]
    else:
        id_, seq, topic, key, event_type, text, raw, headers, attempts = values[:9]
        parent = state = None
    if raw is not None:
        value = raw if type(raw) is bytes else bytes(raw)
    else:
        value = (text if text is not None else "null").encode("utf-8")
    return _new_tuple(OutboxRow, (
        id_, seq, topic, key, event_type, value, headers or {}, attempts, parent, state, lane,
    ))  # fmt: skip


def to_record(row: OutboxRow, *, source: str | None = None) -> OutgoingRecord:
    """Build the Kafka record of ``row``: key = partition key, headers = event id + stored.

    ``ce_*`` headers are set when the row has an event type (CloudEvents needs
    id, source, type and specversion); ``source`` is the relay's setting,
    ``/<topic>`` by default. The stored trace context becomes ``traceparent``
    / ``tracestate`` (a relay that traces replaces them with its own span's:
    :mod:`producer_outbox.telemetry`).
    """
    event_id = row.id.encode()
    headers: list[tuple[str, bytes | None]] = [("event-id", event_id)]
    if row.event_type is not None:
        headers += [
            ("ce_id", event_id),
            ("ce_type", row.event_type.encode()),
            ("ce_source", (source or f"/{row.topic}").encode()),
            ("ce_specversion", CE_SPECVERSION.encode()),
        ]
    if row.traceparent is not None:
        headers += trace_headers(row.traceparent, row.tracestate)
    if row.headers:
        headers += [(name, value.encode()) for name, value in row.headers.items()]
    key = row.key
    return _new_tuple(OutgoingRecord, (
        row.topic, None if key is None else key.encode(), row.value, headers,
    ))  # fmt: skip


def describe(row: OutboxRow) -> str:
    """Describe a row for logs, briefly of a row (never its payload)."""
    return json.dumps({"id": row.id, "seq": row.seq, "topic": row.topic, "key": row.key})
