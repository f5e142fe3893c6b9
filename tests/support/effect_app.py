"""The kinbox app the fault suite runs in ``kinbox worker`` subprocesses.

One handler on ``FAULT_TOPIC`` inserts a row into ``<KINBOX_SCHEMA>.<FAULT_EFFECT_TABLE>``
(default ``effects``). That table has **no unique constraint** on the event id
on purpose: an event applied twice shows up as two rows.

Behaviour, by environment variable:

``FAULT_HANDLER``
    ``sync`` (default) or ``async``: the handler is ``apply_effect`` on a
    psycopg ``Connection``, or ``apply_effect_async``, the same effect as an
    ``async def`` handler on its ``AsyncConnection`` (the fault suite's
    async app).

``FAULT_KEY_CONCURRENCY``
    above 0: the handler is registered in key order (``ordering="key"``),
    applying that many keys at once.

``FAULT_PARK_KEYS`` / ``FAULT_HOLD_EVERY`` / ``FAULT_HOLD_FILE``
    ``FAULT_PARK_KEYS`` set: the handler parks keys (``park_keys=True``).
    Every ``FAULT_HOLD_EVERY``-th event (by sequence number) is dead-lettered
    at once (``DeadLetter``) while the file ``FAULT_HOLD_FILE`` exists, and
    applied once it is gone (the fix deployed, its dead letter replayed).

``FAULT_SLEEP``
    seconds the handler sleeps per event *inside* the transaction (stretches
    batches so a signal or a fault lands mid-batch).
``FAULT_FAIL_TIMES`` / ``FAULT_FAIL_EVERY``
    the handler raises a transient error on the first ``FAULT_FAIL_TIMES``
    attempts of every ``FAULT_FAIL_EVERY``-th event (by its sequence number).
``FAULT_POISON_EVERY``
    every ``FAULT_POISON_EVERY``-th event (by sequence number) is poison: the
    handler raises :class:`PoisonError` on every attempt, so kinbox must
    dead-letter it after ``max_attempts``.
``FAULT_SLOW_IDS`` / ``FAULT_SLOW_SECONDS`` / ``FAULT_GATE``
    the handler holds each event whose id is in the comma-separated
    ``FAULT_SLOW_IDS`` for ``FAULT_SLOW_SECONDS`` (inside the transaction); with
    ``FAULT_GATE`` set it holds until that file exists instead (at most
    ``FAULT_SLOW_SECONDS``), so a test can release it exactly when its fault is
    in place. A held call writes ``w <partition> <offset> <id> begin|end <time>``
    lines (``time.monotonic()``: one clock for every process on the machine).
``FAULT_EXIT_IDS``
    the handler calls ``sys.exit(3)`` for each event whose id is in this
    comma-separated list (the sync handler on its batch thread, the async one
    inside its coroutine).
``FAULT_KILL_LOOP_IDS``
    the async handler, for these ids, has the event loop call ``sys.exit(3)``
    (as a callback, which asyncio lets end the loop's thread) and waits.
``FAULT_HOOK_FAIL_IDS``
    the middleware's ``before_batch`` raises for a batch holding one of these ids.
``FAULT_STOP_HOLDS_GIL``
    set (to anything): the middleware's ``after_worker_stop`` blocks in a C
    call that keeps the GIL for ten minutes (no Python thread of the worker
    runs meanwhile, as when librdkafka leaves the binding waiting inside
    ``Consumer.close()``).
``FAULT_BROKEN_UNLESS``
    a path: until a file exists there, the handler raises
    :class:`BrokenDeployError` for every event (a bad deploy; creating the
    file is the fix).
``FAULT_VALUES``
    the name of a table in ``KINBOX_SCHEMA`` (the scenario creates it, see
    :data:`VALUES_DDL`) into which the handler also writes the payload's
    ``short``, ``n``, ``note``, ``big`` and ``key`` fields, so PostgreSQL
    refuses some payloads: a ``short`` over ``varchar(8)``, an ``n`` over
    ``integer``, a ``note`` with NUL, a ``big`` over the btree index row
    limit (in the handler's statement), or a ``key`` an earlier event holds
    (``UNIQUE DEFERRABLE INITIALLY DEFERRED``: refused only at COMMIT).
``FAULT_LOG_DIR``
    where this process appends its *delivery log*, ``deliveries-<pid>.log``:
    one ``d <partition> <offset> <id>`` line per record kinbox hands to the
    batch processor, ``h <partition> <offset> <id> <attempt>`` per handler call
    and ``r <applied> <duplicates>`` per committed partition batch. Lines are
    written with ``os.write`` on an ``O_APPEND`` descriptor, so they survive a
    SIGKILL a moment later; the scoreboard's delivery counts come from here.

``SIGUSR1``
    makes the process write the Python stack of every thread to its stderr
    (the worker's log), without stopping it: a test that waited in vain for
    a member asks it where it is stuck (:meth:`tests.support.workers.Worker.dump_stacks`).

The ``d`` and ``r`` lines come from a :class:`kinbox.Middleware`
(``DeliveryLog``, a :class:`tests.support.worker_log.BatchLog`): counting
what the consumer really received is the only way to tell "no redelivery"
from "redelivered and suppressed".
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import AsyncConnection, sql

from kinbox import App, DeadLetter, Event
from kinbox.core.record import Record
from kinbox.middleware.base import WorkerInfo
from tests.support.worker_log import BatchLog, header_id, process_log, stacks_on_sigusr1

TOPIC = os.environ.get("FAULT_TOPIC", "fault-test")
SCHEMA = os.environ.get("KINBOX_SCHEMA", "kinbox")
TABLE = os.environ.get("FAULT_EFFECT_TABLE", "effects")
SLEEP = float(os.environ.get("FAULT_SLEEP", "0"))
FAIL_TIMES = int(os.environ.get("FAULT_FAIL_TIMES", "0"))
FAIL_EVERY = int(os.environ.get("FAULT_FAIL_EVERY", "1"))
POISON_EVERY = int(os.environ.get("FAULT_POISON_EVERY", "0"))
SLOW_IDS = frozenset(filter(None, os.environ.get("FAULT_SLOW_IDS", "").split(",")))
SLOW_SECONDS = float(os.environ.get("FAULT_SLOW_SECONDS", "0"))
GATE = os.environ.get("FAULT_GATE", "")
LOG_DIR = os.environ.get("FAULT_LOG_DIR", "")
VALUES = os.environ.get("FAULT_VALUES", "")
BROKEN_UNLESS = os.environ.get("FAULT_BROKEN_UNLESS", "")
EXIT_IDS = frozenset(filter(None, os.environ.get("FAULT_EXIT_IDS", "").split(",")))
KILL_LOOP_IDS = frozenset(filter(None, os.environ.get("FAULT_KILL_LOOP_IDS", "").split(",")))
HOOK_FAIL_IDS = frozenset(filter(None, os.environ.get("FAULT_HOOK_FAIL_IDS", "").split(",")))
STOP_HOLDS_GIL = bool(os.environ.get("FAULT_STOP_HOLDS_GIL"))
HANDLER = os.environ.get("FAULT_HANDLER", "sync")
KEY_CONCURRENCY = int(os.environ.get("FAULT_KEY_CONCURRENCY") or "0")
PARK_KEYS = bool(os.environ.get("FAULT_PARK_KEYS"))
HOLD_EVERY = int(os.environ.get("FAULT_HOLD_EVERY") or "0")
HOLD_FILE = os.environ.get("FAULT_HOLD_FILE", "")

VALUES_DDL = (
    "CREATE TABLE {0}.{1} (event_id text, short varchar(8), n integer, note text, big text,"
    " key text UNIQUE DEFERRABLE INITIALLY DEFERRED); CREATE INDEX ON {0}.{1} (big)"
)
"""The ``FAULT_VALUES`` table, formatted with the schema and table identifiers."""


class TransientHandlerError(RuntimeError):
    """Raised by the handler on purpose: the next attempt succeeds."""


class BrokenDeployError(RuntimeError):
    """Raised for every event until the fix is deployed (``FAULT_BROKEN_UNLESS``)."""


class PoisonError(ValueError):
    """Raised by the handler on purpose on every attempt: the event can never be applied."""


stacks_on_sigusr1()
_log = process_log(LOG_DIR, "deliveries")


class DeliveryLog(BatchLog):
    """The delivery log's ``d`` (received) and ``r`` (committed batch) lines.

    Its ``before_batch`` raises for a batch holding one of ``FAULT_HOOK_FAIL_IDS``.
    """

    def __init__(self) -> None:
        super().__init__(_log, each_record=True)

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        super().before_batch(topic, partition, records)
        if HOOK_FAIL_IDS and any(header_id(r) in HOOK_FAIL_IDS for r in records):
            raise RuntimeError("injected: a middleware's before_batch is broken")

    def after_worker_stop(self, worker: WorkerInfo, error: BaseException | None) -> None:
        if STOP_HOLDS_GIL:
            ctypes.PyDLL(None).sleep(600)  # a C call that keeps the GIL


app = App(group_id=os.environ.get("KINBOX_GROUP_ID", "fault-test"), schema=SCHEMA)
app.add_middleware(DeliveryLog())
_insert = sql.SQL(
    'INSERT INTO {}.{} (event_id, topic, partition, "offset", pid) VALUES (%s, %s, %s, %s, %s)'
).format(sql.Identifier(SCHEMA), sql.Identifier(TABLE))
_values = sql.SQL("INSERT INTO {}.{} VALUES (%s, %s, %s, %s, %s, %s)").format(
    sql.Identifier(SCHEMA), sql.Identifier(VALUES or "-")
)


def apply_effect(event: Event, tx: Any) -> None:
    """Insert one effect row; optionally sleep, hold, fail, always fail, or write payload values."""
    _log_call(event)
    if event.id in EXIT_IDS:
        sys.exit(3)
    if SLEEP:
        time.sleep(SLEEP)
    if event.id in SLOW_IDS:
        for _ in _holding(event):
            time.sleep(0.02)
    for statement, params in _writes(event):
        tx.execute(statement, params)


async def apply_effect_async(event: Event, tx: AsyncConnection[Any]) -> None:
    """:func:`apply_effect` as an ``async def`` handler on its ``AsyncConnection``."""
    _log_call(event)
    if event.id in EXIT_IDS:
        sys.exit(3)
    if event.id in KILL_LOOP_IDS:
        asyncio.get_running_loop().call_soon(sys.exit, 3)
        await asyncio.sleep(60)
    if SLEEP:
        await asyncio.sleep(SLEEP)
    if event.id in SLOW_IDS:
        for _ in _holding(event):
            await asyncio.sleep(0.02)
    for statement, params in _writes(event):
        await tx.execute(statement, params)


_handler = apply_effect_async if HANDLER == "async" else apply_effect
if KEY_CONCURRENCY:
    app.handler(TOPIC, ordering="key", concurrency=KEY_CONCURRENCY, park_keys=PARK_KEYS)(_handler)
else:
    app.handler(TOPIC, park_keys=PARK_KEYS)(_handler)


def _log_call(event: Event) -> None:
    _log(f"h {event.partition} {event.offset} {''.join(event.id.split()) or '-'} {event.attempt}")


def _writes(event: Event) -> list[tuple[sql.Composed, tuple[Any, ...]]]:
    """The statements of ``event``'s effect, or the failure injected for it."""
    if BROKEN_UNLESS and not os.path.exists(BROKEN_UNLESS):
        raise BrokenDeployError(f"bad deploy: {event.id} fails like every event")
    if HOLD_EVERY and _every(event.id, HOLD_EVERY) and os.path.exists(HOLD_FILE):
        raise DeadLetter(f"held: {event.id} waits for the fix")
    if POISON_EVERY and _every(event.id, POISON_EVERY):
        raise PoisonError(f"injected poison: {event.id} can never be applied")
    if FAIL_TIMES and event.attempt <= FAIL_TIMES and _every(event.id, FAIL_EVERY):
        raise TransientHandlerError(f"injected failure, attempt {event.attempt} of {event.id}")
    writes = []
    if VALUES:
        body = event.json()
        fields = [body.get(name) for name in ("short", "n", "note", "big", "key")]
        writes.append((_values, (event.id, *fields)))
    row = (event.id, event.topic, event.partition, event.offset, os.getpid())
    return [*writes, (_insert, row)]


def _holding(event: Event) -> Iterator[None]:
    """Yield while the handler must stay busy (see ``FAULT_SLOW_*`` in the module docstring)."""
    where = f"{event.partition} {event.offset} {event.id}"
    begin = time.monotonic()
    _log(f"w {where} begin {begin:.3f}")
    while time.monotonic() < begin + SLOW_SECONDS and not (GATE and os.path.exists(GATE)):
        yield
    _log(f"w {where} end {time.monotonic():.3f}")


def _every(event_id: str, every: int) -> bool:
    """Whether a suite event id (``run-17``) is a multiple of ``every``; other ids never are."""
    tail = event_id.rsplit("-", 1)[-1]
    return tail.isdigit() and int(tail) % every == 0
