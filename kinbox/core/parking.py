"""Key-ordered parking: what a key's state is, as the engine and the stores share it.

A route registered with ``park_keys=True`` keeps a key's events in order
past a dead letter: once an event of a key is dead-lettered, the key is
*blocked* by it, and its later events are *parked* (kept in the database,
not applied) instead of overtaking it. An operator *releases* the key
(replaying the dead letter, or giving it up): the parked events are
re-published, in the order they were parked, and applied as they come back;
once none is left, the key is free again. Records without a key are never
parked.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyState:
    """A blocked key of one topic, as one inbox transaction finds it.

    Attributes:
        blocked_by: the event id of the dead letter the key waits behind.
        released: an operator released the key: once its parked events are
            all applied, it is free.
        released_ids: the parked events re-published by that release, which
            may run when they come back.
        unreleased: parked events of the key that no release let go (parked
            after it began): while there are any, the key stays blocked.
    """

    blocked_by: str
    released: bool = False
    released_ids: frozenset[str] = frozenset()
    unreleased: int = 0


@dataclass(frozen=True, slots=True)
class Parked:
    """One event to park: its record's parts and the dead letter it waits behind."""

    event_id: str
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None
    blocked_by: str
