"""The dead letters, read from their topics and grouped by cause.

Which topics: ``<topic>.dlq`` (kinbox's default) of each topic a group of
this schema consumes (the groups with rows in ``processed_events``, their
topics those they committed offsets in), plus those given with
``--dlq-topic`` (a handler's own ``dead_letter_topic=``). Which dead letters:
those a group of this schema gave up (``kinbox.dlq.consumer``); another
service's groups may share a topic, and so its dead-letter topic, and their
dead letters are theirs to see in their own console.
How much: the newest ``scan_limit`` records of each (:func:`read_tail`), by a
group-less reader that commits nothing, so the cost is bounded however long
a topic is; the page says when a topic holds more than was read.

Each dead letter is then matched with what PostgreSQL knows of it:

- the operators' decisions (:class:`~kinbox.store.decisions.DecisionLog`): a
  dead letter replayed or discarded is no longer *open*; it stays in Kafka;
- its group's row in ``processed_events``: still ``dead_lettered``, or
  ``applied`` once a replay went through.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from kinbox.apply.envelope import event_id
from kinbox.console.fingerprint import LetterCause, cause
from kinbox.core.config import Settings
from kinbox.core.errors import EnvelopeError
from kinbox.core.letter import PREFIX, header
from kinbox.core.record import Position, Record
from kinbox.kafka.inspect import Inspector
from kinbox.kafka.producer_config import producer_config
from kinbox.kafka.reader import read_tail
from kinbox.store.decisions import Closed, DecidedRecord, DecisionLog
from kinbox.store.inspect import InboxReader

DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True)
class LetterView:
    """One dead letter and what is known of it.

    Attributes:
        record: the record in the dead-letter topic.
        cause: its cause (and so its group).
        event_id: its event id, if it carries a valid one.
        closed: the finished decision that dealt with it, if any.
        verdict: its group's ``processed_events`` status now, if there is a row.
    """

    record: Record
    cause: LetterCause
    event_id: str | None
    closed: Closed | None = None
    verdict: str | None = None

    @property
    def coordinates(self) -> Position:
        """Where it is: ``(dead-letter topic, partition, offset)``."""
        return self.record.position

    @property
    def at(self) -> dt.datetime | None:
        """When it was dead-lettered: the record's timestamp."""
        stamp = self.record.timestamp
        return None if stamp is None else dt.datetime.fromtimestamp(stamp / 1000, dt.UTC)

    def dlq(self, name: str) -> str | None:
        """The ``kinbox.dlq.<name>`` header as text."""
        return header(self.record, PREFIX + name)

    def decided(self) -> DecidedRecord:
        """The row of ``operator_decision_records`` for it."""
        return DecidedRecord(*self.coordinates, self.event_id, self.cause.group or None)


@dataclass
class LetterGroup:
    """The dead letters of one cause, newest first."""

    cause: LetterCause
    letters: list[LetterView] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        """The cause's fingerprint."""
        return self.cause.fingerprint

    @property
    def open(self) -> list[LetterView]:
        """Those no decision has dealt with yet."""
        return [letter for letter in self.letters if letter.closed is None]

    @property
    def first_seen(self) -> dt.datetime | None:
        """The oldest open dead letter's time (of all, when none is open)."""
        times = [t for t in (x.at for x in self.open or self.letters) if t is not None]
        return min(times, default=None)

    @property
    def last_seen(self) -> dt.datetime | None:
        """The newest open dead letter's time (of all, when none is open)."""
        times = [t for t in (x.at for x in self.open or self.letters) if t is not None]
        return max(times, default=None)

    @property
    def topics(self) -> list[str]:
        """The dead-letter topics its letters are in."""
        return sorted({letter.record.topic for letter in self.letters})

    @property
    def message(self) -> str:
        """The newest letter's error message: an example of what went wrong."""
        return next((m for m in (x.dlq("error.message") for x in self.letters) if m), "")


@dataclass(frozen=True)
class TopicCount:
    """One dead-letter topic: what it keeps (every group's), what was read, what is open of ours."""

    topic: str
    kept: int
    read: int
    open: int

    @property
    def partial(self) -> bool:
        """Whether the topic keeps more than was read."""
        return self.kept > self.read


@dataclass
class Scan:
    """The dead letters read at one moment."""

    limit: int
    topics: list[TopicCount] = field(default_factory=list)
    groups: list[LetterGroup] = field(default_factory=list)
    read_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    decisions: bool = True
    """Whether the decisions table exists (without it nothing is known closed)."""

    @property
    def open(self) -> int:
        """Open dead letters among those read."""
        return sum(len(g.open) for g in self.groups)

    def group(self, fingerprint: str) -> LetterGroup | None:
        """The group of ``fingerprint``, if any letter read has it."""
        return next((g for g in self.groups if g.fingerprint == fingerprint), None)

    def find(self, topic: str, partition: int, offset: int) -> LetterView | None:
        """The letter at those coordinates, if it was read."""
        wanted = (topic, partition, offset)
        return next((x for g in self.groups for x in g.letters if x.coordinates == wanted), None)


def dlq_topics(inspector: Inspector, groups: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The dead-letter topics that exist: ``<topic>.dlq`` of the groups' topics, and ``extra``."""
    consumed = {topic for group in groups for topic, _ in inspector.committed(group)}
    wanted = {t + DLQ_SUFFIX for t in consumed} | set(extra)
    return [n for n in inspector.topic_names() if n in wanted]


def kept(inspector: Inspector, topics: list[str]) -> dict[str, int]:
    """Records each topic keeps now (end offset - first offset, summed over partitions)."""
    marks = inspector.watermarks(inspector.partitions(topics))
    out = dict.fromkeys(topics, 0)
    for (topic, _), (first, end) in marks.items():
        out[topic] += max(0, end - first)
    return out


def scan(
    settings: Settings, limit: int, extra: Iterable[str] = (), log: DecisionLog | None = None
) -> Scan:
    """Read the newest ``limit`` records of each dead-letter topic and group them by cause.

    Raises:
        TransportError: the broker did not answer.
        StoreError: the database cannot be read.
    """
    with InboxReader(settings.database_url, settings.schema) as reader:
        ours = set(reader.consumers())
    inspector = Inspector(producer_config(settings))
    topics = dlq_topics(inspector, sorted(ours), extra)
    sizes = kept(inspector, topics)
    found: list[tuple[Record, LetterCause]] = []
    read: dict[str, int] = {}
    for topic in topics:
        records = read_tail(settings, topic, limit)
        read[topic] = len(records)
        found += [(r, c) for r in records if (c := cause(r)) is not None and c.group in ours]
    with_log = log is not None and log.available()
    closed = log.closed([r.position for r, _ in found]) if with_log and log else {}
    ids = {r.position: _event_id(r, settings) for r, _ in found}
    with InboxReader(settings.database_url, settings.schema) as reader:
        verdicts = reader.statuses(
            (c.group, i) for (r, c) in found if (i := ids[r.position]) is not None
        )
    groups: dict[str, LetterGroup] = {}
    for record, why in found:
        key = record.position
        letter = LetterView(
            record, why, ids[key], closed.get(key), _verdict(verdicts, why.group, ids[key])
        )
        groups.setdefault(why.fingerprint, LetterGroup(why)).letters.append(letter)
    ordered = sorted(
        groups.values(),
        key=lambda g: (len(g.open), g.last_seen or dt.datetime.min.replace(tzinfo=dt.UTC)),
        reverse=True,
    )
    opened: dict[str, int] = dict.fromkeys(topics, 0)
    for group in ordered:
        for letter in group.open:
            opened[letter.record.topic] += 1
    counts = [TopicCount(t, sizes.get(t, 0), read[t], opened[t]) for t in topics]
    return Scan(limit, counts, ordered, decisions=with_log)


def _event_id(record: Record, settings: Settings) -> str | None:
    try:
        return event_id(record, settings.id_headers)
    except EnvelopeError:
        return None


def _verdict(
    verdicts: dict[tuple[str, str], tuple[str, dt.datetime]], group: str, id_: str | None
) -> str | None:
    if id_ is None:
        return None
    found = verdicts.get((group, id_))
    return None if found is None else found[0]
