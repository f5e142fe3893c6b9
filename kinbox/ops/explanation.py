"""What ``kinbox explain <event-id>`` gathers: one event's story across groups and the outbox.

Which groups to search: those given, else every group with a row in
``processed_events``, found by a loose index scan of the primary key (one
descent per group, milliseconds on ten million rows, where ``SELECT DISTINCT
consumer`` reads them all). The broker's list of groups is not used: a group
that never wrote to this table has no row to find, and one whose offsets
expired still has its rows. Then one primary-key probe per group finds the
event (:mod:`kinbox.store.inspect`), and its deliveries that reused the id
with a different payload (recorded by the worker, never applied).

The outbox, when this schema has one: the row published *as* the event (the
relay's records carry their row's id as the event id), and the rows the
event's own transactions enqueued (:mod:`producer_outbox.links`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kinbox.core.config import Settings
from kinbox.core.errors import SchemaError
from kinbox.store import migrations
from kinbox.store.inspect import InboxReader, Processed, Reused
from producer_outbox.links import OutboxEntry, caused_by, source
from producer_outbox.schema import OUTBOX


@dataclass(frozen=True)
class Explanation:
    """One event, as this database knows it."""

    event_id: str
    groups: list[str]
    """The groups searched."""
    processed: list[Processed] = field(default_factory=list)
    outbox: bool = False
    """Whether this schema has an outbox (migrated) to look in."""
    source: OutboxEntry | None = None
    """The outbox row published as this event, if it is here."""
    enqueued: list[OutboxEntry] = field(default_factory=list)
    """Rows enqueued while a group handled this event."""
    reused: list[Reused] = field(default_factory=list)
    """Deliveries that reused the id with a different payload (not applied)."""

    @property
    def found(self) -> bool:
        """Whether anything of the event is here."""
        return bool(self.processed or self.source or self.enqueued)

    @property
    def unseen(self) -> list[str]:
        """Groups searched that have no row of the event."""
        seen = {p.consumer for p in self.processed}
        return [g for g in self.groups if g not in seen]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "event_id": self.event_id,
            "groups_searched": self.groups,
            "processed": [vars(p) for p in self.processed],
            "not_seen_by": self.unseen,
            "outbox": self.outbox,
            "source": None if self.source is None else vars(self.source),
            "enqueued": [vars(row) for row in self.enqueued],
            "reused": [vars(row) for row in self.reused],
        }


def explain(settings: Settings, event_id: str, groups: list[str] | None = None) -> Explanation:
    """Find ``event_id`` in ``processed_events`` and the outbox of ``settings.schema``.

    Raises:
        StoreError, SchemaError: the database cannot be read.
    """
    with InboxReader(settings.database_url, settings.schema) as reader:
        names = sorted(set(groups)) if groups else reader.consumers()
        processed = reader.lookup(names, event_id)
        reused = reader.reused(names, event_id) if processed else []
        try:
            migrations.check(reader.connection, reader.schema, OUTBOX)
        except SchemaError:
            return Explanation(event_id, names, processed, reused=reused)
        return Explanation(
            event_id,
            names,
            processed,
            outbox=True,
            source=source(reader.connection, reader.schema, event_id),
            enqueued=caused_by(reader.connection, reader.schema, names, event_id),
            reused=reused,
        )
