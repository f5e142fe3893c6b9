"""Parked keys of the inbox: read them, release them or discard them — once the inbox parks.

Key-ordered parking (once an event is dead-lettered, the later events of its
key wait in a table until it is replayed or discarded) is not part of this
kinbox yet. The console's page and actions are written against the small
interface below, :class:`ParkedKeySource`, so the inbox's parking plugs in
by returning its own source from :func:`source`; until then every schema
answers :class:`NotEnabled`, and the page says so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from kinbox.core.config import Settings
from kinbox.core.errors import KinboxError
from kinbox.core.publisher import Publisher
from kinbox.ops import parked_keys


@dataclass(frozen=True)
class ParkedKey:
    """One key of one group whose events wait behind a dead letter.

    Attributes:
        group: the consumer group.
        topic: the topic of the key's events.
        key: the record key, as text.
        waiting: events of the key parked behind the dead letter.
        blocked_by: the event id of the dead letter they wait for.
        since: when the first of them was parked.
    """

    group: str
    topic: str
    key: str
    waiting: int
    blocked_by: str | None
    since: dt.datetime | None


@dataclass(frozen=True)
class ParkedKeys:
    """What a source holds now: whether parking is on, and the keys parked."""

    enabled: bool
    keys: list[ParkedKey] = field(default_factory=list)
    note: str = ""
    """Said on the page: why parking is off, or how the keys are chosen."""
    actions: bool = False
    """Whether the source can release and discard keys."""


class ParkedKeySource(Protocol):
    """Where the console reads parked keys and acts on them."""

    def read(self, limit: int) -> ParkedKeys:
        """The first ``limit`` parked keys (and whether parking is on at all)."""
        ...

    def release(self, group: str, topic: str, key: str) -> int:
        """Let the key's parked events go on to their handler; return how many."""
        ...

    def discard(self, group: str, topic: str, key: str) -> int:
        """Drop the key's parked events (their effect is given up); return how many."""
        ...


class NotEnabled:
    """The source of a schema whose inbox does not park keys."""

    def __init__(self, schema: str) -> None:
        self._schema = schema

    def read(self, limit: int) -> ParkedKeys:
        """Nothing is parked: say why."""
        return ParkedKeys(
            enabled=False,
            note=(
                f"Key-ordered parking is not enabled for the inbox in schema {self._schema!r}: "
                "a dead letter does not hold back the later events of its key, so no key is "
                "parked. Dead letters are on the Dead letters page."
            ),
        )

    def release(self, group: str, topic: str, key: str) -> int:
        """Refused: there is nothing to release."""
        raise KinboxError(f"no parked keys in schema {self._schema!r}: parking is not enabled")

    def discard(self, group: str, topic: str, key: str) -> int:
        """Refused: there is nothing to discard."""
        raise KinboxError(f"no parked keys in schema {self._schema!r}: parking is not enabled")


class InboxParking:
    """The parked keys of the inbox in ``settings.schema`` (:mod:`kinbox.ops.parked_keys`).

    Args:
        settings: the database, and the Kafka a release re-publishes to.
        publisher: makes the publisher a release sends with.
    """

    def __init__(self, settings: Settings, publisher: Callable[[Settings], Publisher]) -> None:
        self._settings = settings
        self._publisher = publisher

    def read(self, limit: int) -> ParkedKeys:
        """The first ``limit`` parked keys, oldest first."""
        rows = parked_keys.parked_keys(self._settings, None, limit)
        keys = [
            ParkedKey(
                r.group, r.topic, parked_keys.key_text(r.key), r.waiting, r.blocked_by, r.since
            )
            for r in rows
        ]
        note = (
            "Keys of handlers registered with park_keys=True whose events wait behind a dead "
            "letter. Release re-publishes them in order; discard gives them up."
        )
        return ParkedKeys(enabled=True, keys=keys, note=note, actions=True)

    def release(self, group: str, topic: str, key: str) -> int:
        """Re-publish the key's parked events, in order (``kinbox dlq release``)."""
        raw = parked_keys.parse_key(key)
        return parked_keys.with_publisher(
            self._settings,
            self._publisher,
            lambda p: parked_keys.release(self._settings, group, topic, raw, p),
        )

    def discard(self, group: str, topic: str, key: str) -> int:
        """Give the key's parked events up (``kinbox dlq discard``)."""
        return parked_keys.discard(self._settings, group, topic, parked_keys.parse_key(key))


def source(
    settings: Settings, publisher: Callable[[Settings], Publisher] | None = None
) -> ParkedKeySource:
    """The parked keys of ``settings.schema``: the one place the inbox's parking plugs in.

    The inbox's own when its tables have them and a publisher is given, else :class:`NotEnabled`.
    """
    if publisher is None or not settings.database_url:
        return NotEnabled(settings.schema)
    return InboxParking(settings, publisher)
