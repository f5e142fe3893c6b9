"""What ``kinbox status`` gathers: per group lag and activity, the table, the outbox, the slots.

The broker says where each group is (:mod:`kinbox.ops.group_lag`), the database
what it did (:mod:`kinbox.store.inspect`), the outbox's own status and the
replication slots come from :mod:`producer_outbox.outbox_status` and
:mod:`producer_outbox.slots`. :class:`Thresholds` turns what is found into
warnings; the command exits non-zero when there is any, so it can serve as a
probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kinbox.core.config import Settings
from kinbox.core.errors import SchemaError
from kinbox.kafka.inspect import Inspector
from kinbox.kafka.producer_config import producer_config
from kinbox.ops.group_lag import GroupLag, read_lag
from kinbox.store import migrations
from kinbox.store.inspect import Counted, InboxReader, TableStats
from producer_outbox.outbox_status import OutboxStatus, read_status
from producer_outbox.schema import OUTBOX
from producer_outbox.slots import DEFAULT_WARN_BYTES, SlotStatus, read_slots


@dataclass(frozen=True)
class Thresholds:
    """Past these, ``kinbox status`` warns and exits non-zero."""

    max_lag: int = 100_000
    """Records a partition may be behind."""
    max_age: float = 300.0
    """Seconds the oldest unprocessed record of a partition may wait."""
    slot_bytes: int = DEFAULT_WARN_BYTES
    """WAL a replication slot may hold back."""
    max_parked: int = 0
    """Parked outbox rows (each blocks its key)."""


@dataclass(frozen=True)
class GroupStatus:
    """One consumer group: the broker's view and the database's."""

    lag: GroupLag
    window: dict[str, Counted] = field(default_factory=dict)
    """Rows per status processed within the window."""
    verdicts: dict[str, Counted] = field(default_factory=dict)
    """All ``dead_lettered``, ``skipped`` and ``parked`` rows, per status."""

    def as_dict(self, window: timedelta) -> dict[str, Any]:
        """JSON-ready form."""
        seconds = window.total_seconds()
        group = self.lag.group
        return {
            "group": group.group_id,
            "state": group.state,
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.host.lstrip("/"),
                    "instance_id": m.instance_id,
                    "partitions": [{"topic": t, "partition": p} for t, p in m.partitions],
                }
                for m in group.members
            ],
            "partitions": [p.as_dict(self.lag.read_at_ms) for p in self.lag.partitions],
            "lag": self.lag.lag,
            "oldest_unprocessed_seconds": _round(self.lag.oldest_age()),
            "window": {
                status: {"rows": c.rows, "per_second": round(c.rows / seconds, 3)}
                for status, c in sorted(self.window.items())
            },
            "dead_lettered": self.dead_letters,
            "skipped": self.verdicts.get("skipped", Counted(0, None)).rows,
            "parked": self.verdicts.get("parked", Counted(0, None)).rows,
        }

    @property
    def dead_letters(self) -> int:
        """The group's ``dead_lettered`` rows (all of them, not only the window's)."""
        return self.verdicts.get("dead_lettered", Counted(0, None)).rows


@dataclass(frozen=True)
class StatusReport:
    """Everything ``kinbox status`` shows."""

    schema: str
    window: timedelta
    groups: list[GroupStatus]
    table: TableStats
    outbox: OutboxStatus | None
    slots: list[SlotStatus]
    warnings: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``status --json``)."""
        return {
            "schema": self.schema,
            "window_seconds": self.window.total_seconds(),
            "groups": [g.as_dict(self.window) for g in self.groups],
            "processed_events": {
                "rows_estimate": self.table.rows_estimate,
                "total_bytes": self.table.total_bytes,
                "oldest_row_seconds": _round(self.table.oldest_seconds),
            },
            "outbox": None if self.outbox is None else self.outbox.as_dict(),
            "replication_slots": [slot.as_dict() for slot in self.slots],
            "warnings": self.warnings,
        }


def gather(
    settings: Settings,
    groups: list[str] | None,
    *,
    window: timedelta = timedelta(minutes=5),
    thresholds: Thresholds = Thresholds(),
) -> StatusReport:
    """Read the status of ``groups`` (default: every group with rows in ``processed_events``).

    Raises:
        StoreError, SchemaError: the database cannot be read.
        TransportError: the broker did not answer.
    """
    with InboxReader(settings.database_url, settings.schema) as reader:
        names = sorted(set(groups)) if groups else reader.consumers()
        activity = reader.activity(names, window)
        verdicts = reader.verdicts(names)
        table = reader.table()
        outbox = _outbox(reader)
        slots = read_slots(reader.connection)
    inspector = Inspector(producer_config(settings))
    found = [
        GroupStatus(read_lag(inspector, name), activity.get(name, {}), verdicts.get(name, {}))
        for name in names
    ]
    warnings = [w for g in found for w in _group_warnings(g.lag, thresholds)]
    warnings += [w for w in (slot.warning(thresholds.slot_bytes) for slot in slots) if w]
    if outbox is not None and outbox.dead > thresholds.max_parked:
        warnings.append(
            f"outbox: {outbox.dead} parked row(s) (threshold {thresholds.max_parked}), each "
            "blocking its key: see `kinbox outbox status`, then `kinbox outbox requeue`"
        )
    return StatusReport(settings.schema, window, found, table, outbox, slots, warnings)


def _outbox(reader: InboxReader) -> OutboxStatus | None:
    """The outbox's status, or ``None`` when this schema has no (migrated) outbox."""
    try:
        migrations.check(reader.connection, reader.schema, OUTBOX)
    except SchemaError:
        return None
    return read_status(reader.connection, reader.schema)


def _group_warnings(lag: GroupLag, limits: Thresholds) -> list[str]:
    out = []
    name = lag.group.group_id
    for p in lag.partitions:
        where = f"group {name!r}: {p.topic}[{p.partition}]"
        if p.lag > limits.max_lag:
            out.append(f"{where} is {p.lag} records behind (threshold {limits.max_lag})")
        age = p.age(lag.read_at_ms)
        if age is not None and age > limits.max_age:
            owner = f"owned by member {p.owner}" if p.owner else "NOT ASSIGNED to any member"
            out.append(
                f"{where}: the oldest unprocessed record waits for {age:.0f}s "
                f"(threshold {limits.max_age:.0f}s), {owner}"
            )
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_UNITS = (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1))


def ago(seconds: float) -> str:
    """``0.4s``, ``12s``, ``5m 3s``, ``3h 12m``, ``13d 4h``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, length, sub, sublength in _UNITS:
        if whole >= length:
            return f"{whole // length}{unit} {(whole % length) // sublength}{sub}"
    return f"{whole}s"
