"""Turn a consumed :class:`~kinbox.core.record.Record` into an :class:`~kinbox.core.event.Event`.

The event id comes from the first configured header present (``event-id``,
then CloudEvents' ``ce_id``, then Debezium's ``id`` by default). A record
whose id is missing or malformed raises :class:`~kinbox.core.errors.EnvelopeError`
carrying topic/partition/offset; the runner hands it to the failure policy,
so bad input never crashes the loop and is never skipped silently.

Malformed means: empty, not UTF-8, over :data:`MAX_ID_BYTES`, repeated with
different values, or holding U+0000 (NUL), which PostgreSQL ``text`` cannot
store. That check is cheap and catches the common case; an id the database
refuses for another reason (a server encoding without a code for one of its
characters) is found when its claim fails and handled the same way (see
:mod:`kinbox.apply.narrow`). A record whose headers the Kafka client could not
read at all (a header *name* that is not UTF-8) has no id either.
"""

from __future__ import annotations

from collections.abc import Sequence

from kinbox.core.describe import text
from kinbox.core.errors import EnvelopeError, StoreError
from kinbox.core.event import Event
from kinbox.core.record import Record

MAX_ID_BYTES = 255
"""Longest event id accepted, in UTF-8 bytes (the ``event_id`` column holds text)."""

_ABSENT = object()


def event_id(record: Record, id_headers: Sequence[str]) -> str:
    """Return the record's event id from the first of ``id_headers`` it carries.

    A header repeated with the same value is accepted; repeated with different
    values it is ambiguous, and the record is rejected rather than guessed at.

    Raises:
        EnvelopeError: no id header, or the id is empty, not UTF-8, too long,
            holds NUL or is ambiguous; or the headers could not be read.
    """
    if record.headers_error is not None:
        raise _error(record, f"the record's headers cannot be read: {record.headers_error}")
    headers = record.headers
    for name in id_headers:
        # One pass, no list: this runs for every record, and most carry the
        # first name once.
        raw: object = _ABSENT
        for key, value in headers:
            if key == name:
                if raw is _ABSENT:
                    raw = value
                elif value != raw:
                    raise _error(record, f"header {name!r} is repeated with different values")
        if raw is _ABSENT:
            continue
        if not isinstance(raw, bytes) or raw == b"":
            raise _error(record, f"header {name!r} is empty")
        if len(raw) > MAX_ID_BYTES:
            raise _error(record, f"header {name!r} is {len(raw)} bytes, at most {MAX_ID_BYTES}")
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _error(record, f"header {name!r} is not UTF-8: {raw[:40]!r}") from None
        if "\x00" in decoded:
            raise _error(
                record, f"header {name!r} holds NUL, which PostgreSQL cannot store: {raw[:40]!r}"
            )
        return decoded
    raise _error(record, f"no event id header (looked for {', '.join(id_headers)})")


def to_event(record: Record, id_headers: Sequence[str], attempt: int = 1) -> Event:
    """Build the :class:`Event` for ``record``.

    Raises:
        EnvelopeError: see :func:`event_id`.
    """
    return _event(record, event_id(record, id_headers), attempt)


def _event(record: Record, id_: str, attempt: int) -> Event:
    topic, partition, offset, key, value, headers, timestamp, _ = record
    # tuple.__new__ with every field, as namedtuple's own _make does: the
    # generated __new__ is one more Python call, a third of this function's
    # cost, paid for every record.
    return _new_tuple(Event, (
        id_, topic, partition, offset, key, b"" if value is None else value, headers, timestamp,
        attempt,
    ))  # fmt: skip


_new_tuple = tuple.__new__


def derived_id(record: Record) -> str:
    """``topic/partition/offset``: an id for a record that has none (``missing_id=derive``)."""
    return f"{record.topic}/{record.partition}/{record.offset}"


def derived_event(record: Record, attempt: int = 1) -> Event:
    """The :class:`Event` for ``record`` with its :func:`derived_id`."""
    return _event(record, derived_id(record), attempt)


def unstorable_id(record: Record, event_id: str, error: StoreError) -> EnvelopeError:
    """The :class:`EnvelopeError` for an id the database refused to store (``error``)."""
    return _error(record, f"event id {event_id[:60]!r} cannot be stored: {text(error, 300)}")


def _error(record: Record, reason: str) -> EnvelopeError:
    return EnvelopeError(
        f"{reason} at {record.topic}[{record.partition}]@{record.offset}",
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
    )
