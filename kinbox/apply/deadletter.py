"""Dead letters sent (:func:`send`) and replayed (:func:`replay`): kinbox publishing a letter.

:func:`send` queues one on the dead-letter publisher, with its ``kinbox.dlq.*``
headers (:mod:`kinbox.core.letter`), inside the batch's transaction;
:func:`replay` re-publishes dead letters to their original topics for
``kinbox dlq replay`` (and the console), marked as replays.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from kinbox.core.letter import PREFIX, Letter, header, headers, replay_headers
from kinbox.core.publisher import Publisher
from kinbox.core.record import Record

log = logging.getLogger(__name__)


def send(publisher: Publisher, letter: Letter, max_bytes: int | None = None) -> None:
    """Queue ``letter`` on ``publisher``; the caller flushes before the COMMIT that records it.

    The caller has no transaction open meanwhile (see :mod:`kinbox.apply.batch`).

    Raises:
        TransportError: the record cannot fit ``max_bytes`` (see :func:`headers`),
            or the client refused it at once.
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
    publisher.send(letter.target, r.key, r.value, headers(letter, max_bytes=max_bytes))


@dataclass
class ReplayReport:
    """What ``kinbox dlq replay`` did (or would do, in a dry run)."""

    read: int = 0
    replayed: int = 0
    skipped: int = 0
    lines: list[str] | None = None


def replay(
    records: Iterable[Record],
    publisher: Publisher | None,
    *,
    filter_reason: str | None = None,
    limit: int | None = None,
) -> ReplayReport:
    """Re-publish dead letters to their original topics; ``publisher=None`` is a dry run.

    Records without a ``kinbox.dlq.topic`` header are not dead letters and are
    skipped. The publisher is flushed at the end, so on return every replayed
    record is acknowledged.

    Raises:
        TransportError: a record could not be published (some may have been).
    """
    report = ReplayReport(lines=[])
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
        if publisher is not None:
            publisher.send(origin, record.key, record.value, replay_headers(record))
    if publisher is not None:
        publisher.flush()
    return report
