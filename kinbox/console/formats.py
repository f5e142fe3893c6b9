"""How the pages write times, durations and sizes (Jinja filters)."""

from __future__ import annotations

import datetime as dt

from kinbox.ops.status_report import ago
from producer_outbox.slots import format_size

__all__ = ["ago", "format_size", "moment", "since"]


def moment(value: dt.datetime | None) -> str:
    """``2025-05-01 12:03:04 UTC``; ``-`` for none."""
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def since(value: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """``5m 3s ago``; ``-`` for none."""
    if value is None:
        return "-"
    seconds = ((now or dt.datetime.now(dt.UTC)) - value).total_seconds()
    return f"{ago(max(0.0, seconds))} ago"
