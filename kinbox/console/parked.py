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
from dataclasses import dataclass, field
from typing import Protocol

from kinbox.core.config import Settings
from kinbox.core.errors import KinboxError


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


def source(settings: Settings) -> ParkedKeySource:
    """The parked keys of ``settings.schema``: the one place the inbox's parking plugs in."""
    return NotEnabled(settings.schema)
