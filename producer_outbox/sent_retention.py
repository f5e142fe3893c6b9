"""How long sent outbox rows are kept: at least as long as their records can still be consumed.

The inbox's window protects exactly-once: a ``processed_events`` row deleted
too early lets a redelivery apply its event again (:mod:`kinbox.ops.dedup_window`).
The outbox has no such duty. A row is published again only while it is not
marked sent (a relay killed between Kafka's acknowledgement and its COMMIT),
and cleanup never touches pending or parked rows; once sent, nothing of
at-least-once or of per-key order depends on the row. So the outbox's
equivalent window is about what the row *tells*: it is the source of the
event it became — ``kinbox explain`` finds an event's outbox row by its id,
with the consumer event that caused it and (with tracing) its trace context.
While the record is still on its topic, a consumer can still receive it for
the first time (a new or lagging group) or again (a reset, a replay); its
row should still be there to explain it.

So sent rows are kept at least as long as the longest ``retention.ms`` among
the topics of the rows due for deletion (read from the broker, with the
relay's Kafka settings). A topic that keeps records forever sets no floor:
an outbox kept forever is the failure the retention exists to prevent, and
no guarantee rests on those rows; cleanup says so instead. The relay's
hourly cleanup raises its age to the floor and logs why; ``kinbox outbox
cleanup`` refuses to go below it unless ``--force``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

TopicRetention = Callable[[list[str]], Mapping[str, int | None]]
"""Topic names -> each existing topic's ``retention.ms`` (``None``: kept forever)."""

# The rows cleanup would delete at this age, by topic: a range of the
# partial sent_at index (relay mode) or of the rows by age (CDC mode).
_TOPICS_SENT = "SELECT DISTINCT topic FROM {outbox} WHERE status = 'sent' AND sent_at < now() - %s"
_TOPICS_CREATED = "SELECT DISTINCT topic FROM {outbox} WHERE created_at < now() - %s"


@dataclass(frozen=True)
class Floor:
    """The age below which sent rows are kept, and why."""

    keep: timedelta
    topic: str | None = None
    """The topic whose retention set ``keep``; ``None``: the configured retention did."""
    forever: list[str] = field(default_factory=list)
    """Topics that keep records forever (no floor from them)."""

    def explain(self, requested: timedelta) -> str:
        """One line for the log or the terminal."""
        days = self.keep.total_seconds() / 86400
        text = f"sent rows are kept {days:g} days"
        if self.topic is not None and self.keep > requested:
            text += f", not {requested.total_seconds() / 86400:g}: topic {self.topic!r} keeps "
            text += "its records that long, and until then a consumer can still receive one "
            text += "and explain it by its outbox row"
        if self.forever:
            text += f"; topics kept forever set no floor: {', '.join(self.forever)}"
        return text


def floor(
    conn: psycopg.Connection[Any],
    schema: str,
    retention: timedelta,
    topic_retention: TopicRetention,
    *,
    cdc: bool = False,
) -> Floor:
    """The age to keep sent rows (``cdc``: all rows) for, given ``retention`` asked for.

    Raises:
        TransportError: the broker did not answer (nothing should be deleted then).
    """
    query = sql.SQL(_TOPICS_CREATED if cdc else _TOPICS_SENT).format(
        outbox=sql.Identifier(schema, "outbox")
    )
    topics = sorted(row[0] for row in conn.execute(query, (retention,)))
    if not topics:
        return Floor(retention)
    kept = topic_retention(topics)
    forever = sorted(t for t, ms in kept.items() if ms is None)
    finite = {t: ms for t, ms in kept.items() if ms is not None}
    if not finite:
        return Floor(retention, forever=forever)
    topic, ms = max(finite.items(), key=lambda item: (item[1], item[0]))
    longest = timedelta(milliseconds=ms)
    if longest <= retention:
        return Floor(retention, forever=forever)
    return Floor(longest, topic, forever)


def broker_retention(kafka_config: Mapping[str, Any]) -> TopicRetention:
    """Each topic's ``retention.ms`` as the broker reports it, with these Kafka settings.

    The admin client is made at the first call (the relay's first cleanup),
    then reused.
    """
    from kinbox.kafka.inspect import Inspector

    made: list[Inspector] = []

    def read(topics: list[str]) -> dict[str, int | None]:
        if not made:
            made.append(Inspector(kafka_config))
        return {name: kept.ms for name, kept in made[0].retention(topics).items()}

    return read
