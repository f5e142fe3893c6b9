"""``kinbox status``: the consumer groups, the inbox table, the outbox and the slots, with warnings.

A table for people, ``--json`` for machines; exit code 8 when a threshold is
crossed (lag, oldest unprocessed record, slot WAL, parked outbox rows), so
the command can serve as a probe.
"""

from __future__ import annotations

import json
from typing import Any

import click

from kinbox.cli.outbox_support import size_option
from kinbox.cli.support import (
    EXIT_THRESHOLD,
    connection_options,
    guard,
    load_settings,
    parse_duration,
)
from kinbox.ops.status_report import GroupStatus, StatusReport, Thresholds, ago, gather
from producer_outbox.slots import format_size


def _duration(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    return parse_duration(value).total_seconds()


@click.command()
@click.option(
    "--group", "groups", multiple=True, help="Consumer group (repeatable); default: every "
    "group with rows in processed_events.",
)  # fmt: skip
@click.option("--window", default="5m", show_default=True, help="Activity window (30s, 5m, 1h).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--max-lag", type=click.IntRange(0), default=Thresholds.max_lag, show_default=True,
    help="Warn when a partition is more records behind.",
)  # fmt: skip
@click.option(
    "--max-age", default="5m", show_default=True, callback=_duration,
    help="Warn when a partition's oldest unprocessed record waits longer.",
)  # fmt: skip
@click.option(
    "--slot-warn-bytes", default="1GiB", show_default=True, callback=size_option,
    envvar="KINBOX_SLOT_WARN_BYTES", help="Warn when a replication slot holds back more WAL.",
)  # fmt: skip
@click.option(
    "--max-parked", type=click.IntRange(0), default=0, show_default=True,
    help="Warn when more outbox rows are parked.",
)  # fmt: skip
@connection_options
def status(
    groups: tuple[str, ...],
    window: str,
    as_json: bool,
    max_lag: int,
    max_age: float,
    slot_warn_bytes: int,
    max_parked: int,
    **connection: Any,
) -> None:
    """Show each consumer group's members, lag and activity, the inbox table, outbox and slots.

    Exits 8 when a threshold is crossed (and 4 when Kafka or PostgreSQL
    cannot be reached), so it can serve as a probe.
    """
    settings = load_settings(**connection)
    limits = Thresholds(max_lag, max_age, slot_warn_bytes, max_parked)
    span = parse_duration(window)
    report: StatusReport = guard(
        lambda: gather(settings, list(groups) or None, window=span, thresholds=limits)
    )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        click.echo(render(report, window))
    for warning in report.warnings:
        click.echo(f"WARNING: {warning}", err=True)
    if report.warnings:
        raise SystemExit(EXIT_THRESHOLD)


def render(report: StatusReport, window: str) -> str:
    """The report as text tables."""
    lines: list[str] = []
    for group in report.groups:
        lines += _group(group, window, report.window.total_seconds())
        lines.append("")
    if not report.groups:
        lines += ["no consumer group has rows in processed_events yet", ""]
    t = report.table
    rows = "?" if t.rows_estimate is None else f"~{t.rows_estimate:,}"
    oldest = "-" if t.oldest_seconds is None else ago(t.oldest_seconds)
    lines.append(
        f"processed_events  {rows} rows, {format_size(t.total_bytes)}, oldest row {oldest}"
    )
    o = report.outbox
    if o is None:
        lines.append("outbox            not in this schema")
    else:
        lines.append(
            f"outbox            pending {o.pending:,} (retrying {o.retrying:,}), oldest unsent "
            f"{ago(o.oldest_pending_seconds)}, parked {o.dead:,}, blocked keys {o.blocked:,}, "
            f"failing topics {len(o.failing_topics)}, sent (kept) {o.sent:,}"
        )
    if not report.slots:
        lines.append("replication slots none")
    for slot in report.slots:
        state = "active" if slot.active else "INACTIVE"
        lines.append(
            f"replication slot  {slot.name} ({slot.plugin}, {state}, wal_status "
            f"{slot.wal_status}): retains {format_size(slot.retained_bytes)}, unconfirmed "
            f"{format_size(slot.unconfirmed_bytes)}"
        )
    lines.append("")
    lines.append(f"{len(report.warnings)} warning(s)" if report.warnings else "OK")
    return "\n".join(lines)


def _group(group: GroupStatus, window: str, seconds: float) -> list[str]:
    g = group.lag.group
    lines = [f"group {g.group_id}  ({g.state}, {len(g.members)} member(s))"]
    for m in g.members:
        parts = ", ".join(f"{t}[{p}]" for t, p in m.partitions) or "no partitions"
        lines.append(f"  member {_short(m.member_id)} {m.client_id}@{m.host.lstrip('/')}: {parts}")
    table = [("topic", "partition", "committed", "end", "lag", "oldest unprocessed", "owner")]
    for p in group.lag.partitions:
        age = p.age(group.lag.read_at_ms)
        table.append(
            (
                p.topic,
                str(p.partition),
                "-" if p.committed is None else str(p.committed),
                str(p.end),
                f"{p.lag:,}",
                "-" if age is None else ago(age),
                "-" if p.owner is None else _short(p.owner),
            )
        )
    if len(table) > 1:
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            cells = [
                # Numbers right-aligned, names left.
                cell.rjust(width) if 0 < i < 5 else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  " + "  ".join(cells).rstrip())
    done = ", ".join(
        f"{status} {c.rows:,} ({c.rows / seconds:.1f}/s)"
        for status, c in sorted(group.window.items())
    )
    lines.append(f"  processed in the last {window}: {done or 'nothing'}")
    skipped = group.verdicts.get("skipped")
    parked = group.verdicts.get("parked")
    lines.append(
        f"  dead-lettered {group.dead_letters:,} in all"
        + (f", skipped {skipped.rows:,}" if skipped else "")
        + (f", parked {parked.rows:,} (kinbox dlq parked)" if parked else "")
    )
    return lines


def _short(member_id: str) -> str:
    """The tail of a member id: unique enough to tell the members of one group apart."""
    return member_id[-8:]
