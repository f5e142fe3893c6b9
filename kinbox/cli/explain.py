"""``kinbox explain <event-id>``: which groups processed an event, how, and what it caused."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from kinbox.cli.support import connection_options, guard, load_settings
from kinbox.ops.explanation import Explanation, explain
from producer_outbox.links import OutboxEntry


@click.command(name="explain")
@click.argument("event_id", metavar="EVENT-ID")
@click.option(
    "--group", "groups", multiple=True,
    help="Consumer group (repeatable); default: every group with rows in processed_events.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@connection_options
def explain_command(event_id: str, groups: tuple[str, ...], as_json: bool, **options: Any) -> None:
    """Say which consumer groups processed EVENT-ID: when, from where, with what verdict.

    Also its trace id, the outbox row it was published from (when that outbox
    is in this database) and the rows its transaction enqueued. Exits 1 when
    nothing of the event is found.
    """
    settings = load_settings(**options)
    found: Explanation = guard(lambda: explain(settings, event_id, list(groups) or None))
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2, default=str))
    else:
        click.echo(render(found))
    if not found.found:
        raise SystemExit(1)


def render(found: Explanation) -> str:
    """The explanation as text."""
    lines = [f"event {found.event_id}"]
    if found.source is not None:
        lines.append("  published from the outbox of this database:")
        lines.append("    " + _entry(found.source, found.event_id))
    searched = len(found.groups)
    lines.append(f"  processed by {len(found.processed)} of {searched} group(s) searched:")
    for p in found.processed:
        where = f"{p.topic}[{p.partition}]@{p.offset}"
        line = f"    {p.consumer}  {p.status}  {where}  at {_when(p.processed_at)}"
        line += f"  trace {p.trace_id}" if p.trace_id else "  no trace id"
        lines.append(line)
        if p.reason:
            lines.append(f"      reason: {p.reason}")
    if found.reused:
        lines.append(f"  id reused with a different payload ({len(found.reused)}), not applied:")
        for r in found.reused:
            first = f"{r.first_topic}[{r.first_partition}]@{r.first_offset}"
            lines.append(
                f"    {r.consumer}  {r.topic}[{r.partition}]@{r.offset}  at {_when(r.seen_at)}"
                f"  (first processed from {first})"
            )
    if found.unseen:
        lines.append(f"  no row in: {', '.join(found.unseen)}")
    if not found.outbox:
        lines.append("  outbox: none in this schema")
    elif found.enqueued:
        lines.append("  enqueued in the transaction that handled it:")
        lines += ["    " + _entry(row, found.event_id) for row in found.enqueued]
    else:
        lines.append("  enqueued nothing in this schema's outbox while handled")
    if not found.found:
        lines.append("  not found")
    return "\n".join(lines)


def _entry(row: OutboxEntry, event_id: str) -> str:
    text = f"{row.id} topic={row.topic} key={row.key!r} {row.status}"
    text += f" (attempts {row.attempts}) enqueued {_when(row.created_at)}"
    if row.sent_at is not None:
        text += f", sent {_when(row.sent_at)}"
    if row.caused_by_consumer is not None:
        text += f"; by group {row.caused_by_consumer}"
        if row.caused_by_event_id != event_id:  # upstream: the event before this one
            text += f" handling {row.caused_by_event_id or 'a batch of events'}"
    return text


def _when(moment: datetime) -> str:
    return moment.isoformat(sep=" ", timespec="milliseconds")
