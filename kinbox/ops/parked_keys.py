"""An operator's actions on parked keys: list, release (re-publish in order), discard.

Releasing a key hands its parked events back in the order they were parked
and re-publishes them to their topic with the ``kinbox.replay`` header, as a
dead letter's replay goes; the worker applies them as they come back
(:mod:`kinbox.apply.parking`). The blocking dead letter itself is not
re-published: ``kinbox dlq replay`` does that, and then releases the keys it
blocked (:func:`release_blocked_by`), so it goes first and they follow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, KinboxError
from kinbox.core.letter import replay_headers
from kinbox.core.publisher import OutgoingRecord, Publisher, deliver
from kinbox.core.record import Record
from kinbox.store.inspect import InboxReader
from kinbox.store.parking import ParkedKeyRow, Parking


def key_text(key: bytes) -> str:
    """A record key as operators see and give it: UTF-8 text, else ``hex:`` and its bytes."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + key.hex()
    return "hex:" + key.hex() if text.startswith("hex:") or not text.isprintable() else text


def parse_key(text: str) -> bytes:
    """The key :func:`key_text` shows as ``text``.

    Raises:
        ConfigurationError: ``hex:`` followed by what is not hex.
    """
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise ConfigurationError(f"key {text!r}: hex: needs pairs of hex digits") from None
    return text.encode("utf-8")


def parked_keys(
    settings: Settings, group: str | None, limit: int = 1000, *, idle: bool = False
) -> list[ParkedKeyRow]:
    """The parked keys of ``settings.schema`` (of ``group``, or all), oldest first.

    ``idle``: also the keys blocked with nothing parked yet.
    """
    with InboxReader(settings.database_url, settings.schema) as reader:
        return Parking(reader.connection, reader.schema).keys(group, limit, idle=idle)


def release(settings: Settings, group: str, topic: str, key: bytes, publisher: Publisher) -> int:
    """Release ``key``: re-publish its parked events, in order; return how many.

    Raises:
        KinboxError: the key is not parked.
        TransportError: a record was not acknowledged (release again: a
            record that comes back twice is a duplicate the inbox drops).
    """
    with InboxReader(settings.database_url, settings.schema) as reader:
        released = Parking(reader.connection, reader.schema).release(group, topic, key)
    if released is None:
        raise KinboxError(f"key {key!r} of topic {topic!r} is not parked for group {group!r}")
    deliver(publisher, (_again(r.record) for r in released))
    return len(released)


def release_blocked_by(
    settings: Settings, group: str, event_ids: Sequence[str], publisher: Publisher
) -> int:
    """Release every key of ``group`` that one of ``event_ids`` blocks; return events released."""
    with InboxReader(settings.database_url, settings.schema) as reader:
        parking = Parking(reader.connection, reader.schema)
        keys = parking.blocked_by(group, event_ids)
        # A key may be freed meanwhile: its replayed dead letter, with nothing
        # parked behind it, was applied already. Nothing to release then.
        released = [parking.release(group, topic, key) for topic, key in keys]
    found = [r.record for batch in released if batch is not None for r in batch]
    deliver(publisher, (_again(record) for record in found))
    return len(found)


def discard(settings: Settings, group: str, topic: str, key: bytes) -> int:
    """Give ``key``'s parked events up (``skipped``) and free it; return how many.

    Raises:
        KinboxError: the key is not parked.
    """
    with InboxReader(settings.database_url, settings.schema) as reader:
        count = Parking(reader.connection, reader.schema).discard(group, topic, key)
    if count is None:
        raise KinboxError(f"key {key!r} of topic {topic!r} is not parked for group {group!r}")
    return count


def with_publisher(
    settings: Settings, make: Callable[[Settings], Publisher], act: Callable[[Publisher], int]
) -> int:
    """``act`` with a publisher made for ``settings``, closed after."""
    publisher = make(settings)
    try:
        return act(publisher)
    finally:
        publisher.close()


def _again(record: Record) -> OutgoingRecord:
    return OutgoingRecord(record.topic, record.key, record.value, replay_headers(record))
