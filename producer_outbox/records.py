"""Outbox rows and the Kafka records made from them (pure, no I/O)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from producer_outbox.trace_context import headers as trace_headers

#: CloudEvents spec version announced in ``ce_specversion``.
CE_SPECVERSION = "1.0"


@dataclass(frozen=True)
class OutboxRow:
    """One claimed row of ``<schema>.outbox``."""

    id: uuid.UUID
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


@dataclass(frozen=True)
class Record:
    """What the publisher sends: one Kafka record."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def row_from_db(values: tuple[Any, ...]) -> OutboxRow:
    """Build an :class:`OutboxRow` from ``claim``'s column order (the trace context last)."""
    id_, seq, topic, key, event_type, payload_text, payload_bytes, headers, attempts = values[:9]
    traceparent, tracestate = (*values[9:11], None, None)[:2]
    if payload_bytes is not None:
        value = bytes(payload_bytes)
    else:
        value = (payload_text if payload_text is not None else "null").encode("utf-8")
    return OutboxRow(
        id=id_,
        seq=seq,
        topic=topic,
        key=key,
        event_type=event_type,
        value=value,
        headers=dict(headers or {}),
        attempts=attempts,
        traceparent=traceparent,
        tracestate=tracestate,
    )


def to_record(row: OutboxRow, *, source: str | None = None) -> Record:
    """Build the Kafka record of ``row``: key = partition key, headers = event id + stored.

    ``ce_*`` headers are set when the row has an event type (CloudEvents needs
    id, source, type and specversion); ``source`` is the relay's setting,
    ``/<topic>`` by default. The stored trace context becomes ``traceparent``
    / ``tracestate`` (a relay that traces replaces them with its own span's:
    :mod:`producer_outbox.telemetry`).
    """
    event_id = str(row.id).encode()
    headers: list[tuple[str, bytes]] = [("event-id", event_id)]
    if row.event_type is not None:
        headers += [
            ("ce_id", event_id),
            ("ce_type", row.event_type.encode()),
            ("ce_source", (source or f"/{row.topic}").encode()),
            ("ce_specversion", CE_SPECVERSION.encode()),
        ]
    headers += trace_headers(row.traceparent, row.tracestate)
    headers += [(name, value.encode()) for name, value in row.headers.items()]
    return Record(
        topic=row.topic,
        key=row.key.encode() if row.key is not None else None,
        value=row.value,
        headers=headers,
    )


def describe(row: OutboxRow) -> str:
    """Describe a row for logs, briefly of a row (never its payload)."""
    return json.dumps({"id": str(row.id), "seq": row.seq, "topic": row.topic, "key": row.key})
