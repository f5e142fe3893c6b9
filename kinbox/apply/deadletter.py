"""Dead letters sent (:func:`message`) and replayed (:func:`replay`): kinbox publishing a letter.

:func:`message` is the record of one, with its ``kinbox.dlq.*`` headers
(:mod:`kinbox.core.letter`), that the batch processor delivers before it
records the letter;
:func:`replay` re-publishes dead letters to their original topics for
``kinbox dlq replay`` (and the console), marked as replays.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kinbox.core.letter import PREFIX, Letter, header, headers, replay_headers
from kinbox.core.publisher import OutgoingRecord, Publisher, deliver
from kinbox.core.record import Record

log = logging.getLogger(__name__)


def message(letter: Letter, max_bytes: int | None = None) -> OutgoingRecord:
    """The record that dead-letters ``letter`` (logged as it is made).

    The caller delivers it before the COMMIT that records the letter, with
    no transaction open meanwhile (see :mod:`kinbox.apply.batch`).

    Raises:
        TransportError: the record cannot fit ``max_bytes`` (see :func:`headers`).
    """
    r = letter.record
    log.error(
        "dead-lettering %s[%d]@%d to %r after %d attempt(s): %s",
        r.topic, r.partition, r.offset, letter.target, letter.attempts, letter.summary,
        extra={
            "topic": r.topic, "partition": r.partition, "offset": r.offset,
            "group": letter.consumer, "dlq_topic": letter.target, "reason": letter.reason,
        },
    )  # fmt: skip
    return OutgoingRecord(letter.target, r.key, r.value, headers(letter, max_bytes=max_bytes))


@dataclass
class ReplayReport:
    """What ``kinbox dlq replay`` did (or would do, in a dry run)."""

    read: int = 0
    replayed: int = 0
    skipped: int = 0
    lines: list[str] | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    """``(consumer group, event id)`` of each dead letter replayed whose id header was found."""


def replay(
    records: Iterable[Record],
    publisher: Publisher | None,
    *,
    filter_reason: str | None = None,
    limit: int | None = None,
    id_headers: Sequence[str] = ("event-id", "ce_id"),
) -> ReplayReport:
    """Re-publish dead letters to their original topics; ``publisher=None`` is a dry run.

    Records without a ``kinbox.dlq.topic`` header are not dead letters and are
    skipped. On return every replayed record is acknowledged.

    Raises:
        TransportError: a record could not be published (some may have been).
    """
    report = ReplayReport(lines=[])
    replays = _replays(records, report, filter_reason, limit, id_headers)
    if publisher is None:
        for _ in replays:
            pass
    else:
        deliver(publisher, replays)
    return report


def _replays(
    records: Iterable[Record],
    report: ReplayReport,
    filter_reason: str | None,
    limit: int | None,
    id_headers: Sequence[str],
) -> Iterator[OutgoingRecord]:
    """The replay of each dead letter ``records`` hold, noted in ``report`` as it is made."""
    for record in records:
        report.read += 1
        origin = header(record, PREFIX + "topic")
        reason = header(record, PREFIX + "reason") or ""
        if origin is None or (filter_reason is not None and filter_reason not in reason):
            report.skipped += 1
            continue
        if limit is not None and report.replayed >= limit:
            break
        report.replayed += 1
        assert report.lines is not None
        report.lines.append(
            f"{record.topic}[{record.partition}]@{record.offset} -> {origin} "
            f"(from {origin}[{header(record, PREFIX + 'partition')}]"
            f"@{header(record, PREFIX + 'offset')}, reason {reason!r})"
        )
        group = header(record, PREFIX + "consumer")
        event_id = next((v for h in id_headers if (v := header(record, h)) is not None), None)
        if group is not None and event_id is not None:
            report.events.append((group, event_id))
        yield OutgoingRecord(origin, record.key, record.value, replay_headers(record))
