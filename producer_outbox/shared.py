"""What a relay's lane groups share, and the observer that hears of the relay as a whole.

Each lane group runs in a thread of its own (:mod:`.group`); :class:`Shared`
is the little they tell each other: that group 0 registered the relay (the
others take lanes only then), how many lanes and rows in flight each has,
and that each turned. The relay's observer (its health) hears of them
together.
"""

from __future__ import annotations

import threading
from typing import Protocol


class RelayObserver(Protocol):
    """Told how the loop is doing (:class:`kinbox.ops.health.Health` is one)."""

    def turned(self) -> None:
        """The loop made progress: a round, a batch, a slice of a wait, a cleanup batch."""

    def holding(self, count: int) -> None:
        """The relay owns ``count`` lanes now."""


class Shared:
    """What a relay's lane groups share: registration, rows in flight, the observer.

    Args:
        groups: how many lane groups the relay runs.
        observer: told of the relay as a whole: the lanes of every group, and
            a turn once every group turned since the last one.
    """

    def __init__(self, groups: int = 1, observer: RelayObserver | None = None) -> None:
        self._lock = threading.Lock()
        self._flying = [0] * groups
        self._observer = observer
        self._groups = groups
        self._turned: set[int] = set()
        self._held = [0] * groups
        self.registered = threading.Event()
        """Set once group 0 registered the relay (or ended): the others start then."""

    def turned(self, group: int) -> None:
        """``group`` made progress; the relay did once every group has."""
        if self._observer is None:
            return
        with self._lock:
            self._turned.add(group)
            if len(self._turned) < self._groups:
                return
            self._turned.clear()
        self._observer.turned()

    def holding(self, group: int, count: int) -> None:
        """``group`` owns ``count`` lanes now."""
        if self._observer is None:
            return
        with self._lock:
            self._held[group] = count
            total = sum(self._held)
        self._observer.holding(total)

    def flying(self, group: int, rows: int) -> None:
        """``group`` has ``rows`` rows in flight now."""
        self._flying[group] = rows

    def others_flying(self, group: int) -> bool:
        """Whether a group other than ``group`` has rows in flight."""
        return any(rows for index, rows in enumerate(self._flying) if index != group)
