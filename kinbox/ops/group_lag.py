"""How far a consumer group is behind, partition by partition: shared by status and retention.

For each partition the group owns or has committed to: the committed offset,
the first and end offsets, the lag (end - committed) and the age of the
oldest record the group has not processed yet — the record at its committed
offset, read from the broker for its timestamp. A partition without a
committed offset is read from its first record, as kinbox's consumer does
(``auto.offset.reset=earliest``); so is one whose committed offset the
broker has already deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kinbox.core.transport import Partition
from kinbox.kafka.inspect import Group, Inspector


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a group."""

    topic: str
    partition: int
    committed: int | None
    first: int
    end: int
    owner: str | None
    """The member id of the member it is assigned to, or ``None``."""
    oldest_unprocessed_ms: int | None = None
    """Timestamp of the first record not processed yet; ``None`` when none waits."""

    @property
    def lag(self) -> int:
        """Records not processed yet."""
        return max(0, self.end - self.position)

    @property
    def position(self) -> int:
        """Where the group reads next: its committed offset, or the first record."""
        committed = self.committed if self.committed is not None else self.first
        return max(committed, self.first)

    def age(self, now_ms: float) -> float | None:
        """Seconds since the oldest unprocessed record was written, if one waits."""
        if self.oldest_unprocessed_ms is None:
            return None
        return max(0.0, (now_ms - self.oldest_unprocessed_ms) / 1000)

    def as_dict(self, now_ms: float) -> dict[str, Any]:
        """JSON-ready form."""
        age = self.age(now_ms)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "first": self.first,
            "end": self.end,
            "lag": self.lag,
            "owner": self.owner,
            "oldest_unprocessed_seconds": None if age is None else round(age, 3),
        }


@dataclass(frozen=True)
class GroupLag:
    """A group's members and partitions, as the broker sees them now."""

    group: Group
    partitions: list[PartitionLag] = field(default_factory=list)
    read_at_ms: float = 0.0

    @property
    def topics(self) -> list[str]:
        """The topics the group owns or has committed offsets for."""
        return sorted({p.topic for p in self.partitions})

    @property
    def lag(self) -> int:
        """Records not processed yet, over all partitions."""
        return sum(p.lag for p in self.partitions)

    def oldest_age(self) -> float | None:
        """Seconds since the oldest unprocessed record of any partition was written."""
        ages = [a for a in (p.age(self.read_at_ms) for p in self.partitions) if a is not None]
        return max(ages, default=None)


def read_lag(inspector: Inspector, group_id: str, topics: Iterable[str] = ()) -> GroupLag:
    """Read ``group_id``'s partitions: committed, first and end offsets, oldest unprocessed.

    Args:
        inspector: the cluster.
        group_id: the group.
        topics: topics to include even if the group has neither an
            assignment nor a committed offset there yet.
    """
    group = inspector.group(group_id)
    committed = inspector.committed(group_id)
    owners = {tp: member.member_id for member in group.members for tp in member.partitions}
    names = {t for t, _ in committed} | {t for t, _ in owners} | set(topics)
    partitions: list[Partition] = inspector.partitions(names)
    marks = inspector.watermarks(partitions)
    rows = [
        PartitionLag(t, p, committed.get((t, p)), first, end, owners.get((t, p)))
        for (t, p), (first, end) in sorted(marks.items())
    ]
    waiting = {(r.topic, r.partition): r.position for r in rows if r.lag > 0}
    stamps = inspector.timestamps(waiting, {(r.topic, r.partition): r.end for r in rows})
    read_at = time.time() * 1000
    rows = [
        PartitionLag(
            r.topic,
            r.partition,
            r.committed,
            r.first,
            r.end,
            r.owner,
            stamps.get((r.topic, r.partition)),
        )
        for r in rows
    ]
    return GroupLag(group, rows, read_at)
