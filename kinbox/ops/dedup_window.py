"""The dedup window: how long ``processed_events`` rows must live, read from the broker.

A row is what makes a second delivery of its event a duplicate. So it must
outlive every way the event can still arrive, for each group that has rows:

- **the topic's retention**: a group reset to the earliest offset (a new
  deployment, expired offsets, an operator's reset) reads everything the
  topic still holds. That is ``retention.ms`` — or longer, since the broker
  deletes whole segments, so the age of the oldest record still there counts
  too. A topic that keeps records forever (``retention.ms=-1``, or compaction
  without deletion) has no safe age at all;
- **the oldest record the group has not consumed yet**: a producer's retry
  of an event the group already applied sits behind it;
- **the oldest dead letter still on a dead-letter topic**: ``kinbox dlq
  replay`` sends it to every group of its topic, and the groups that applied
  the event need its row to ignore it.

A group Kafka knows nothing about (no member, no committed offset: retired,
or its offsets expired, and then a restart reads its topics from the start)
gives no topics to ask about: it is a guard of its own, lifted by naming its
topics (``--topic``) or by ``--force``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kinbox.kafka.inspect import Inspector
from kinbox.ops.group_lag import read_lag

_UNKNOWN = (
    "Kafka knows no member and no committed offset of this group, so which topics it "
    "consumes is unknown; if its offsets expired, a restart reads them from the start "
    "(name them with --topic)"
)


@dataclass(frozen=True)
class Guard:
    """One reason to keep a group's rows for ``keep_seconds`` (``None``: forever)."""

    group: str
    kind: str
    """``topic-retention``, ``unconsumed``, ``dead-letter`` or ``unknown-topics``."""
    subject: str
    keep_seconds: float | None
    why: str

    def forbids(self, older_than: float) -> bool:
        """Whether deleting rows older than ``older_than`` seconds breaks this guard."""
        return self.keep_seconds is None or older_than < self.keep_seconds


def guards(
    inspector: Inspector,
    groups: Sequence[str],
    *,
    topics: Iterable[str] = (),
    dead_letter_topics: Iterable[str] = (),
) -> list[Guard]:
    """The guards of ``groups``: see the module docstring.

    Args:
        inspector: the cluster.
        groups: the consumer groups whose rows would be deleted.
        topics: topics every group consumes, besides those Kafka knows of.
        dead_letter_topics: dead-letter topics besides ``<topic>.dlq``.

    Raises:
        TransportError: the broker did not answer.
    """
    extra = sorted(set(topics))
    found: list[Guard] = []
    for group in groups:
        lag = read_lag(inspector, group, extra)
        if not lag.topics:
            found.append(Guard(group, "unknown-topics", "-", None, _UNKNOWN))
            continue
        found += _topic_guards(inspector, group, lag.topics)
        age = lag.oldest_age()
        if age is not None:
            found.append(
                Guard(group, "unconsumed", "-", age, "the oldest record it has not consumed yet")
            )
        dlqs = sorted({f"{t}.dlq" for t in lag.topics} | set(dead_letter_topics))
        found += _dead_letter_guards(inspector, group, dlqs)
    return found


def floor(found: Iterable[Guard]) -> Guard | None:
    """The guard that keeps rows longest (forever first), or ``None`` when there is none."""
    ordered = sorted(found, key=lambda g: (g.keep_seconds is not None, -(g.keep_seconds or 0.0)))
    return ordered[0] if ordered else None


def _topic_guards(inspector: Inspector, group: str, topics: list[str]) -> list[Guard]:
    retention = inspector.retention(topics)
    oldest = _oldest_ages(inspector, [t for t in topics if t in retention])
    out = []
    for topic in topics:
        kept = retention.get(topic)
        if kept is None:
            continue  # deleted: nothing of it can be delivered again
        if kept.ms is None:
            why = f"the topic keeps records forever (cleanup.policy={kept.cleanup_policy}"
            out.append(Guard(group, "topic-retention", topic, None, why + ", retention.ms=-1)"))
            continue
        seconds = kept.ms / 1000
        why = f"retention.ms={kept.ms}"
        if oldest.get(topic, 0.0) > seconds:
            seconds = oldest[topic]
            why += " and its oldest record is older still (segments are deleted whole)"
        out.append(Guard(group, "topic-retention", topic, seconds, why))
    return out


def _dead_letter_guards(inspector: Inspector, group: str, topics: list[str]) -> list[Guard]:
    return [
        Guard(group, "dead-letter", topic, age, "its oldest dead letter may still be replayed")
        for topic, age in sorted(_oldest_ages(inspector, topics).items())
    ]


def _oldest_ages(inspector: Inspector, topics: list[str]) -> dict[str, float]:
    """Seconds since the oldest record still on each topic was written (topics with any)."""
    marks = inspector.watermarks(inspector.partitions(topics))
    stamps = inspector.timestamps(
        {tp: first for tp, (first, _) in marks.items()},
        {tp: end for tp, (_, end) in marks.items()},
    )
    now = time.time() * 1000
    ages: dict[str, float] = {}
    for (topic, _), stamp in stamps.items():
        ages[topic] = max(ages.get(topic, 0.0), (now - stamp) / 1000)
    return ages
