"""Key-ordered parking in one inbox transaction: who runs, who waits (:mod:`kinbox.core.parking`).

Before the handler runs, the transaction reads which of its events' keys are
blocked (:class:`~kinbox.core.steps.ParkingState`) and sorts its fresh
events out (:func:`sort_out`): an event of a blocked key is parked, unless
it is the key's dead letter replayed or one of the key's parked events an
operator released. While the handler runs, an event dead-lettered blocks its
key for the events of the key after it (the dispatcher skips them:
:class:`Blocks`). Afterwards one :class:`~kinbox.core.steps.Park` step
records all of it (:func:`park_step`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from kinbox.core.event import Event
from kinbox.core.letter import is_replay
from kinbox.core.parking import KeyState, Parked
from kinbox.core.steps import Park


@dataclass
class Sorted:
    """A transaction's fresh events, sorted out by their keys' states."""

    runnable: list[Event] = field(default_factory=list)
    parked: list[tuple[Event, str]] = field(default_factory=list)
    """Events of blocked keys, with the dead letter each waits behind."""
    released: list[Event] = field(default_factory=list)
    """Released parked events, let through (among :attr:`runnable`)."""
    replayed: list[Event] = field(default_factory=list)
    """Keys' dead letters, replayed, let through (among :attr:`runnable`)."""


def keys_of(events: Sequence[Event]) -> set[bytes]:
    """The keys of ``events`` that have one."""
    return {e.key for e in events if e.key is not None}


def sort_out(events: Sequence[Event], states: Mapping[bytes, KeyState]) -> Sorted:
    """Which of ``events`` (fresh, in offset order) run and which are parked.

    A released key whose released events have all come, with nothing of it
    parked otherwise, is free for its events after them in the batch; so is
    a key whose dead letter came back replayed with nothing parked behind it
    (should it fail again, the pass holds the events after it).
    """
    out = Sorted()
    pending = {k: set(s.released_ids) for k, s in states.items() if s.released}
    late: set[bytes] = set()  # released keys with an event parked after the release began
    cleared: set[bytes] = set()  # keys whose dead letter came back with nothing parked behind it
    for event in events:
        key = event.key
        state = None if key is None else states.get(key)
        if key is None or state is None or key in cleared:
            out.runnable.append(event)  # (an event after a failed replay is held in the pass)
        elif event.id in state.released_ids:
            out.runnable.append(event)
            out.released.append(event)
            pending[key].discard(event.id)
        elif event.id == state.blocked_by and is_replay(event.headers):
            out.runnable.append(event)  # the dead letter itself, replayed
            out.replayed.append(event)
            if not (state.unreleased or state.released_ids):
                cleared.add(key)
        elif state.released and not (state.unreleased or pending[key] or key in late):
            out.runnable.append(event)  # after its key's release: free
        else:
            out.parked.append((event, state.blocked_by))
            if state.released:
                late.add(key)
    return out


class Blocks:
    """Keys dead-lettered in this pass, and the later events of theirs that it holds."""

    def __init__(self) -> None:
        self.blockers: dict[bytes, Event] = {}
        """The earliest event dead-lettered of each key."""
        self.held: list[tuple[Event, str]] = []
        """Events skipped for an earlier dead letter of their key, with its id."""

    def dead_lettered(self, event: Event) -> None:
        """``event`` was given up: its key's later events wait behind it."""
        if event.key is not None:
            first = self.blockers.get(event.key)
            if first is None or event.offset < first.offset:
                self.blockers[event.key] = event

    def holds(self, event: Event) -> bool:
        """Whether ``event`` waits behind an earlier dead letter of its key (then it is held)."""
        if event.key is None:
            return False
        blocker = self.blockers.get(event.key)
        if blocker is None or blocker.offset >= event.offset:
            return False
        self.held.append((event, blocker.id))
        return True


def park_step(
    topic: str, sorted_: Sorted, blocks: Blocks, states: Mapping[bytes, KeyState]
) -> Park | None:
    """The :class:`Park` step that records a transaction's parking, or ``None`` if nothing to."""
    waiting = [*sorted_.parked, *blocks.held]
    held_ids = {e.id for e, _ in blocks.held}
    unparked = [e.id for e in sorted_.released if e.id not in held_ids]
    # A released key, or one whose dead letter was replayed and applied, is
    # free once nothing of it is parked (the store checks that).
    # A key dead-lettered again here is blocked, never freed.
    released = {k for k, s in states.items() if s.released}
    applied = {e.key for e in sorted_.replayed if e.key is not None}
    freed: Collection[bytes] = sorted((released | applied) - set(blocks.blockers))
    if not (waiting or blocks.blockers or unparked or freed):
        return None
    return Park(
        topic,
        [_parked(e, by) for e, by in sorted(waiting, key=lambda item: item[0].offset)],
        sorted((key, e.id) for key, e in blocks.blockers.items()),
        unparked,
        freed,
    )


def _parked(event: Event, blocked_by: str) -> Parked:
    key = event.key
    assert key is not None  # only keyed events are ever parked
    return Parked(
        event.id, event.partition, event.offset, key, event.value,
        tuple(event.headers), event.timestamp, blocked_by,
    )  # fmt: skip
