"""One claimed batch: how it goes out keeping each key's order, then every row's verdict.

Sending (:func:`plan`). Fresh rows go out together, in claim order, in one
send. A row that failed before (``attempts > 0``) goes *alone*: a record the
broker refuses — too large for the topic, say — fails the whole produce
request it travels in, so its innocent neighbours fail with it once; alone,
the retry tells the bad row from the others, and only the bad row moves on
towards parking. Alone means on the lane group's second producer, which
carries at most one record of a topic at a time, so nothing else shares its
request. Such a row goes only as the first row of its key in the claim (an
earlier row of its key in the claim goes first, and its outcome decides), and
the rows of its key after it stay for a later claim, once it is settled. A
retried row whose topic already has a row going alone waits, and its key with
it (:mod:`.flight`). Within one send, once a row of a key is refused before it
leaves, the later rows of that key are not sent (:data:`kinbox.core.publisher.HELD`).

Verdicts (:func:`judge`), per row:

==================  ===========================================================
acknowledged        sent
its own failure     ``attempts + 1``, retried after a backoff; parked
                    (``status = 'dead'``) on its ``max_attempts``-th failure
outage              Kafka unreachable, timeouts: ``last_error`` recorded,
                    retried after the relay's outage backoff; never counts,
                    never parks, so a long outage followed by one real
                    failure does not park a row at once
topic failure       the topic is missing or not authorized: the row is left
                    untouched and the topic paused (:mod:`.topics`)
held                waited behind an earlier failed row of its key: left
                    untouched (no attempt is counted: it was never tried)
==================  ===========================================================

A row acknowledged after an earlier row of its key failed *in the same
send* (the broker refused the earlier record in another produce request)
is an order break that cannot be taken back; it is logged at ERROR, never
silent.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from kinbox.core.publisher import Outcome
from producer_outbox.claim import FailedRow
from producer_outbox.config import RelayConfig
from producer_outbox.records import OutboxRow, describe

log = logging.getLogger(__name__)


@dataclass
class Sends:
    """How the rows of one claim go out (indexes into the claim, in claim order)."""

    together: list[int] = field(default_factory=list)
    """Fresh rows: one send."""
    alone: list[int] = field(default_factory=list)
    """Rows that failed before: a send each, on the second producer."""
    waiting: list[int] = field(default_factory=list)
    """Rows that failed before, whose topic has a row going alone already."""


def plan(rows: Sequence[OutboxRow], alone_topics: Collection[str] = ()) -> Sends:
    """Cut a claim into sends, keeping each key's order (see the module docstring).

    ``alone_topics``: topics with a row going alone already. Rows in none of
    the lists stay pending for a later claim: rows of a key behind one of its
    rows that failed before.
    """
    result = Sends()
    topics = set(alone_topics)
    sent_keys: set[str] = set()  # keys with a row in `together`
    stopped: set[str] = set()  # keys whose later rows wait for a later claim
    for index, row in enumerate(rows):
        key = row.key
        if key is not None and key in stopped:
            continue
        if row.attempts == 0:
            result.together.append(index)
            if key is not None:
                sent_keys.add(key)
            continue
        if key is not None:
            stopped.add(key)
            if key in sent_keys:
                continue  # after an earlier row of its key, whose outcome decides its fate
        if row.topic in topics:
            result.waiting.append(index)
        else:
            topics.add(row.topic)
            result.alone.append(index)
    return result


@dataclass
class Marks:
    """What a published batch comes to: the marks its rows get (see the module docstring)."""

    sent: list[str] = field(default_factory=list)
    failed: list[FailedRow] = field(default_factory=list)
    topics: dict[str, str] = field(default_factory=dict)
    """Failing topic -> the error Kafka gave."""
    acked_topics: set[str] = field(default_factory=set)
    held: int = 0
    outages: int = 0
    order_broken: int = 0


def judge(
    rows: Sequence[OutboxRow],
    outcomes: Sequence[Outcome],
    config: RelayConfig,
    *,
    outage_delay: float | None = None,
) -> Marks:
    """Give every published row its verdict.

    Args:
        rows: the claimed rows, in claim order.
        outcomes: one per row, from :func:`publish`.
        config: ``max_attempts`` and the backoff of a row's own failures.
        outage_delay: seconds before an outage's rows are tried again (the
            relay's outage backoff); ``config.backoff(0)`` by default.
    """
    result = Marks()
    delay = config.backoff(0) if outage_delay is None else outage_delay
    failed_keys: set[str] = set()
    outage_error = ""
    for row, outcome in zip(rows, outcomes, strict=True):
        if outcome.ok:
            result.sent.append(row.id)
            result.acked_topics.add(row.topic)
            if row.key is not None and row.key in failed_keys:
                result.order_broken += 1
                log.error(
                    "outbox row %s: per-key order broken: Kafka acknowledged it while an "
                    "earlier row of its key in the same batch failed (refused in another "
                    "produce request); that row will be published after it",
                    describe(row),
                    extra=_row(row),
                )
            continue
        if outcome.held:
            result.held += 1
            continue
        if row.key is not None:
            failed_keys.add(row.key)
        error = outcome.error or "unknown error"
        if outcome.topic_failure:
            result.topics.setdefault(row.topic, error)
        elif outcome.outage:
            result.outages += 1
            outage_error = error
            result.failed.append(FailedRow(row.id, error, delay, park=False, counts=False))
        else:
            attempts = row.attempts + 1
            park = attempts >= config.max_attempts
            result.failed.append(FailedRow(row.id, error, config.backoff(row.attempts), park))
            log.log(
                logging.ERROR if park else logging.WARNING,
                "outbox row %s: publish failed (attempt %d of %d%s): %s",
                describe(row),
                attempts,
                config.max_attempts,
                "; parked as dead, its key's later rows wait until it is requeued" if park else "",
                error,
                extra=_row(row),
            )
    if result.outages:
        log.warning(
            "outbox: %d rows not published, Kafka unavailable (%s); retrying in %.1fs "
            "(an outage never counts as an attempt)",
            result.outages,
            outage_error,
            delay,
        )
    return result


def _row(row: OutboxRow) -> dict[str, object]:
    """The ``extra=`` of a log line about ``row`` (``--log-format json`` fields)."""
    return {"event_id": str(row.id), "topic": row.topic, "key": row.key}
