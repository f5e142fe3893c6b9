"""The kinbox app of the churn soak: three handler kinds that misbehave on purpose.

Every worker the soak starts (``kinbox worker tests.support.soak_app:app``)
consumes three topics, named from ``SOAK_TOPIC``:

``<SOAK_TOPIC>``
    a per-event handler on a psycopg ``Connection``;
``<SOAK_TOPIC>-batch``
    a ``batch=True`` handler (the partition batch's fresh events at once);
``<SOAK_TOPIC>-async``
    an ``async def`` per-event handler on an ``AsyncConnection``.

Each writes one row per event into ``<KINBOX_SCHEMA>.soak_effects``, which
has **no unique key** on the event id: an event applied twice shows up as
two rows, and its ``seq`` (a bigserial) is the order of application (a
handler runs only after its claim, which waits for any other transaction
holding the same ids). What a handler does is written in the record's JSON
payload by the soak's producer (:mod:`tests.support.soak_producer`), so the
checker knows every event's expected verdict from the topic alone:

``ok``
    the effect row.
``slow``
    sleeps ``sleep`` seconds inside the transaction first.
``flaky``
    fails its first ``fails`` tries (fewer than ``max_attempts``), then applies:
    by ``event.attempt`` for the per-event handlers; the batch handler, whose
    events after the first do not count tries, fails a batch holding an event
    of this kind the first time this process sees it, and applies it after.
``poison``
    raises on every try: dead-lettered after ``max_attempts`` tries.
``swallow-savepoint``
    runs a statement PostgreSQL refuses inside a savepoint of its own,
    catches the error and carries on: applied.
``swallow``
    runs such a statement *without* a savepoint and catches the error, so the
    transaction is aborted; then tries its effect anyway, or returns as if
    all went well. Either way the try fails (docs/design.md invariant 5: a handler's
    own statement's error, caught or not, is that event's failed try, never
    an outage), so the event is dead-lettered, and the events around it are
    applied.

Both ``swallow`` kinds read the refused statement's result (``fetchone``) for
half of the events, as a handler that looks something up does: under
kinbox's pipelined pass that is what raises the error inside the handler's
``try``, where a statement alone only queues it. Which of the four ways an
event goes follows from its ``n``.

``SOAK_LOG_DIR``: where this process appends ``batches-<pid>.log``, two lines
per partition batch (``d <records>`` before it, ``r <applied> <duplicates>``
once committed), for the scoreboard's delivery figures. ``SIGUSR1`` writes
every thread's stack to the worker's log (as :mod:`tests.support.effect_app`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import psycopg
from psycopg import sql

from kinbox import App, Event
from tests.support.worker_log import BatchLog, process_log, stacks_on_sigusr1

TOPIC = os.environ.get("SOAK_TOPIC", "soak")
SCHEMA = os.environ.get("KINBOX_SCHEMA", "kinbox")
LOG_DIR = os.environ.get("SOAK_LOG_DIR", "")
TABLE = "soak_effects"

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS {}.{} (seq bigserial PRIMARY KEY, event_id text, topic text,"
    ' partition int, "offset" bigint, key text, n bigint, pid int)'
)
"""The effect table, formatted with the schema and table identifiers (the soak creates it)."""

REFUSED = ("SELECT 1 / 0", "SELECT 'not a number'::int")
"""Statements PostgreSQL refuses (class 22, data exceptions: never an outage)."""


class InjectedFailure(RuntimeError):
    """Raised on purpose by a ``flaky`` event's first tries: a later try applies it."""


class Poison(ValueError):
    """Raised on purpose on every try of a ``poison`` event."""


stacks_on_sigusr1()
_log = process_log(LOG_DIR, "batches")


app = App(group_id=os.environ.get("KINBOX_GROUP_ID", "soak"), schema=SCHEMA)
app.add_middleware(BatchLog(_log))
_insert = sql.SQL(
    'INSERT INTO {}.{} (event_id, topic, partition, "offset", key, n, pid)'
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
).format(sql.Identifier(SCHEMA), sql.Identifier(TABLE))
_seen: set[str] = set()
"""The batch handler's ``flaky`` events this process has failed once already."""


def _row(event: Event, body: dict[str, Any]) -> tuple[object, ...]:
    return (event.id, event.topic, event.partition, event.offset, body["key"], body["n"],
            os.getpid())  # fmt: skip


def _refuses(body: dict[str, Any], attempt: int) -> None:
    """Raise what a ``flaky`` (on its first tries) or ``poison`` event raises."""
    kind = body["kind"]
    if kind == "poison":
        raise Poison(f"injected poison: event {body['n']} can never be applied")
    if kind == "flaky" and attempt <= body["fails"]:
        raise InjectedFailure(f"injected failure, try {attempt} of event {body['n']}")


def _statement(body: dict[str, Any]) -> str:
    return REFUSED[body["n"] % len(REFUSED)]


def _reads(body: dict[str, Any]) -> bool:
    """Whether the event reads its refused statement's result (see the module docstring)."""
    return int(body["n"]) // 2 % 2 == 0


def _effect(event: Event, body: dict[str, Any], tx: psycopg.Connection[Any]) -> None:
    """The effect row, after the refused statement a ``swallow*`` event runs and catches."""
    if body["kind"] == "swallow-savepoint":
        with contextlib.suppress(psycopg.Error), tx.transaction():
            cursor = tx.execute(_statement(body))
            if _reads(body):
                cursor.fetchone()
    elif body["kind"] == "swallow":
        with contextlib.suppress(psycopg.Error):
            cursor = tx.execute(_statement(body))
            if _reads(body):
                cursor.fetchone()
        if body["n"] % 2:
            return
    tx.execute(_insert, _row(event, body))


def apply_each(event: Event, tx: psycopg.Connection[Any]) -> None:
    """The per-event handler: see the module docstring for what each kind does."""
    body = event.json()
    time.sleep(body.get("sleep", 0))
    _refuses(body, event.attempt)
    _effect(event, body, tx)


def apply_batch(events: list[Event], tx: psycopg.Connection[Any]) -> None:
    """The batch handler: every event as :func:`apply_each` would, ``flaky`` once per process."""
    bodies = [event.json() for event in events]
    # Every flaky event of the batch counts as tried now, before anything
    # raises: the one-by-one pass after a poison's last try must apply them.
    fresh = [e.id for e, b in zip(events, bodies, strict=True)
             if b["kind"] == "flaky" and e.id not in _seen]  # fmt: skip
    _seen.update(fresh)
    if fresh:
        raise InjectedFailure(f"injected failure of a batch holding {fresh[:3]}")
    for event, body in zip(events, bodies, strict=True):
        time.sleep(body.get("sleep", 0))
        if body["kind"] == "poison":
            _refuses(body, 1)
        _effect(event, body, tx)


async def apply_async(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
    """:func:`apply_each` as an ``async def`` handler on its ``AsyncConnection``."""
    body = event.json()
    await asyncio.sleep(body.get("sleep", 0))
    _refuses(body, event.attempt)
    if body["kind"] == "swallow-savepoint":
        with contextlib.suppress(psycopg.Error):
            async with tx.transaction():
                acursor = await tx.execute(_statement(body))
                if _reads(body):
                    await acursor.fetchone()
    elif body["kind"] == "swallow":
        with contextlib.suppress(psycopg.Error):
            acursor = await tx.execute(_statement(body))
            if _reads(body):
                await acursor.fetchone()
        if body["n"] % 2:
            return
    await tx.execute(_insert, _row(event, body))


app.handler(TOPIC)(apply_each)
app.handler(f"{TOPIC}-batch", batch=True)(apply_batch)
app.handler(f"{TOPIC}-async")(apply_async)
