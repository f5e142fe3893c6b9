"""Replication slots and the WAL they hold back: the risk CDC brings to the database.

A logical slot keeps every WAL segment from its ``restart_lsn`` on until the
connector confirms it has what came before. While Kafka Connect is down (or
the connector FAILED) nothing is confirmed, so ``pg_wal`` grows with every
write to *any* table of the server, until the disk is full — unless
``max_slot_wal_keep_size`` caps it, in which case PostgreSQL eventually
invalidates the slot (``wal_status = 'lost'``) and the connector must start
over from a new one (events in between are not published).
``kinbox outbox status`` shows this and warns past a threshold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

from kinbox.core.errors import ConnectorError

DEFAULT_WARN_BYTES = 1 << 30
"""Warn when a slot holds back more WAL than this (1 GiB)."""

# pg_current_wal_lsn() fails on a standby; slots are the primary's concern
# (PostgreSQL 15 has no failover slots), so a standby simply reports none.
_SLOTS = """
SELECT slot_name, plugin, active, wal_status,
       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       safe_wal_size
FROM pg_replication_slots
WHERE slot_type = 'logical' AND database = current_database()
ORDER BY slot_name
"""


@dataclass(frozen=True)
class SlotStatus:
    """One logical replication slot of this database.

    ``retained_bytes``: WAL kept for the slot (current LSN - ``restart_lsn``).
    ``unconfirmed_bytes``: WAL the consumer has not confirmed yet (current LSN
    - ``confirmed_flush_lsn``). ``safe_wal_size``: how much more may be written
    before the slot is lost, when ``max_slot_wal_keep_size`` is set.
    """

    name: str
    plugin: str
    active: bool
    wal_status: str | None
    retained_bytes: int
    unconfirmed_bytes: int
    safe_wal_size: int | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(vars(self))

    def warning(self, warn_bytes: int) -> str | None:
        """Say what is wrong with this slot, if anything, or return None."""
        if self.wal_status == "lost":
            return (
                f"replication slot {self.name!r} is lost: PostgreSQL removed WAL it needed; "
                "drop it and re-register the connector (events in between were not published)"
            )
        if self.retained_bytes > warn_bytes:
            state = "active" if self.active else "INACTIVE (is Kafka Connect running?)"
            return (
                f"replication slot {self.name!r} holds back "
                f"{format_size(self.retained_bytes)} of WAL "
                f"(threshold {format_size(warn_bytes)}), {state}"
            )
        return None


def read_slots(conn: psycopg.Connection[Any]) -> list[SlotStatus]:
    """Return the logical slots of the connected database (none on a standby)."""
    if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
        return []
    return [
        SlotStatus(
            name=str(name),
            plugin=str(plugin),
            active=bool(active),
            wal_status=wal_status,
            retained_bytes=int(retained or 0),
            unconfirmed_bytes=int(unconfirmed or 0),
            safe_wal_size=None if safe is None else int(safe),
        )
        for name, plugin, active, wal_status, retained, unconfirmed, safe in conn.execute(_SLOTS)
    ]


def drop_slot(conn: psycopg.Connection[Any], name: str, *, wait: float = 30.0) -> bool:
    """Drop replication slot ``name`` once nothing streams from it; return whether it existed.

    Delete the connector first, or Debezium recreates the slot. A slot is
    dropped only while inactive, so this waits up to ``wait`` seconds for its
    consumer to let go (a stopped connector's task closes its connection),
    then ends the backend still holding it. ``conn`` must be in autocommit.

    Raises:
        ConnectorError: something took the slot back each time, for ``2 * wait`` seconds
            (a connector still configured for it).
    """
    started = time.monotonic()
    while True:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (name,)
        ).fetchone()
        if row is None:
            return False
        waited = time.monotonic() - started
        if row[0] is None:
            try:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                return True
            except psycopg.errors.UndefinedObject:
                return False  # dropped by someone else in between
            except psycopg.errors.ObjectInUse:
                pass  # taken again in between
        elif waited > wait:
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        if waited > 2 * wait:
            raise ConnectorError(
                f"replication slot {name!r} is still in use after {waited:.0f}s: "
                "delete the connector that reads it first"
            )
        time.sleep(0.2)


def format_size(count: int) -> str:
    """Bytes in binary units: ``512 B``, ``8.0 KiB``, ``1.2 GiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"  # pragma: no cover - the loop always returns


def parse_size(text: str) -> int:
    """Parse ``512MB``, ``1GiB``, ``1073741824`` … into bytes (binary units).

    Raises:
        ValueError: not a size.
    """
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    number = raw.rstrip("KMGT")
    unit = raw[len(number) :]
    if not number or unit not in units:
        raise ValueError(f"{text!r} is not a size (e.g. 1073741824, 512MB, 1GiB)")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 1073741824, 512MB, 1GiB)") from None
    if value < 0:
        raise ValueError(f"{text!r}: a size cannot be negative")
    return int(value)
