"""The kinbox app the fault suite runs in ``kinbox worker`` subprocesses.

One handler on ``FAULT_TOPIC`` inserts a row into ``<KINBOX_SCHEMA>.<FAULT_EFFECT_TABLE>``
(default ``effects``). That table has **no unique constraint** on the event id
on purpose: an event applied twice shows up as two rows.

Behaviour, by environment variable:

``FAULT_SLEEP``
    seconds the handler sleeps per event *inside* the transaction (stretches
    batches so a signal or a fault lands mid-batch).
``FAULT_FAIL_TIMES`` / ``FAULT_FAIL_EVERY``
    the handler raises a transient error on the first ``FAULT_FAIL_TIMES``
    attempts of every ``FAULT_FAIL_EVERY``-th event (by its sequence number).
``FAULT_LOG_DIR``
    where this process appends its *delivery log*, ``deliveries-<pid>.log``:
    one ``d <partition> <offset> <id>`` line per record kinbox hands to the
    batch processor, ``h <partition> <offset> <id> <attempt>`` per handler call
    and ``r <applied> <duplicates>`` per committed partition batch. Lines are
    written with ``os.write`` on an ``O_APPEND`` descriptor, so they survive a
    SIGKILL a moment later; the scoreboard's delivery counts come from here.

The delivery lines come from wrapping ``BatchProcessor.process`` in this
(test-only) process: kinbox has no per-record hook, and counting what the
consumer really received is the only way to tell "no redelivery" from
"redelivered and suppressed".
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from kinbox import App, Event
from kinbox.batch import BatchProcessor, BatchResult
from kinbox.envelope import Record

TOPIC = os.environ.get("FAULT_TOPIC", "fault-test")
SCHEMA = os.environ.get("KINBOX_SCHEMA", "kinbox")
TABLE = os.environ.get("FAULT_EFFECT_TABLE", "effects")
SLEEP = float(os.environ.get("FAULT_SLEEP", "0"))
FAIL_TIMES = int(os.environ.get("FAULT_FAIL_TIMES", "0"))
FAIL_EVERY = int(os.environ.get("FAULT_FAIL_EVERY", "1"))
LOG_DIR = os.environ.get("FAULT_LOG_DIR", "")


class TransientHandlerError(RuntimeError):
    """Raised by the handler on purpose: the next attempt succeeds."""


_fd = (
    os.open(
        os.path.join(LOG_DIR, f"deliveries-{os.getpid()}.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    if LOG_DIR
    else -1
)


def _log(line: str) -> None:
    if _fd >= 0:
        os.write(_fd, (line + "\n").encode())


def _header_id(record: Record) -> str:
    for key, value in record.headers:
        if key == "event-id" and value is not None:
            return value.decode("utf-8", "replace")
    return "-"


_original_process = BatchProcessor.process


def _logged_process(
    self: BatchProcessor, records: Sequence[Record], attempt: int = 1
) -> BatchResult:
    # One write for the whole batch: cheaper, and a SIGKILL cannot split it.
    _log("\n".join(f"d {r.partition} {r.offset} {_header_id(r)}" for r in records))
    result = _original_process(self, records, attempt)
    if result.next_offset is not None:
        _log(f"r {result.applied} {result.duplicates}")
    return result


BatchProcessor.process = _logged_process  # type: ignore[method-assign]

app = App(group_id=os.environ.get("KINBOX_GROUP_ID", "fault-test"), schema=SCHEMA)
_insert = sql.SQL(
    'INSERT INTO {}.{} (event_id, topic, partition, "offset", pid) VALUES (%s, %s, %s, %s, %s)'
).format(sql.Identifier(SCHEMA), sql.Identifier(TABLE))


@app.handler(TOPIC)
def apply_effect(event: Event, tx: Any) -> None:
    """Insert one effect row; optionally sleep, or fail the first attempts."""
    _log(f"h {event.partition} {event.offset} {event.id} {event.attempt}")
    if SLEEP:
        time.sleep(SLEEP)
    if FAIL_TIMES and event.attempt <= FAIL_TIMES and _seq(event.id) % FAIL_EVERY == 0:
        raise TransientHandlerError(f"injected failure, attempt {event.attempt} of {event.id}")
    tx.execute(_insert, (event.id, event.topic, event.partition, event.offset, os.getpid()))


def _seq(event_id: str) -> int:
    """The sequence number at the end of a suite event id (``run-17`` -> 17)."""
    tail = event_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0
