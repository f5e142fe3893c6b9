"""What the test apps that ``kinbox worker`` runs write besides their effects.

A per-process log of what the worker did (:func:`process_log`), appended with
one ``os.write`` on an ``O_APPEND`` descriptor per line or group of lines, so
it survives a SIGKILL a moment later; what each partition batch received and
applied, written there by :class:`BatchLog`; and every thread's stack on
``SIGUSR1`` (:func:`stacks_on_sigusr1`), for a test that waited in vain for a
member (:meth:`tests.support.workers.Worker.dump_stacks`).
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Callable, Sequence

from kinbox import Middleware
from kinbox.core.outcome import BatchResult
from kinbox.core.record import Record


def stacks_on_sigusr1() -> None:
    """Write every thread's Python stack to stderr (the worker's log) on ``SIGUSR1``.

    faulthandler writes from its C-level signal handler: a Python handler would
    wait for the main thread to reach its next bytecode, which a thread blocked
    inside librdkafka never does.
    """
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def process_log(directory: str, stem: str) -> Callable[[str], None]:
    """An appender to ``<directory>/<stem>-<pid>.log``; one that drops everything without one."""
    if not directory:
        return lambda text: None
    fd = os.open(
        os.path.join(directory, f"{stem}-{os.getpid()}.log"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )

    def append(text: str) -> None:
        os.write(fd, (text + "\n").encode())

    return append


class BatchLog(Middleware):
    """Writes ``d`` lines (received) before each partition batch, ``r`` once it committed.

    Args:
        log: where (a :func:`process_log`).
        each_record: one ``d <partition> <offset> <id>`` line per record;
            otherwise one ``d <records>`` line per batch. The ``r <applied>
            <duplicates>`` line follows a batch that committed.
    """

    def __init__(self, log: Callable[[str], None], *, each_record: bool = False) -> None:
        self._log = log
        self._each = each_record

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        # One write for the whole batch: cheaper, and a SIGKILL cannot split it.
        if self._each:
            self._log("\n".join(f"d {r.partition} {r.offset} {header_id(r)}" for r in records))
        else:
            self._log(f"d {len(records)}")

    def after_batch(
        self, topic: str, partition: int, records: Sequence[Record], result: BatchResult,
        error: BaseException | None,
    ) -> None:  # fmt: skip
        if result.next_offset is not None:
            self._log(f"r {result.applied} {result.duplicates}")


def header_id(record: Record) -> str:
    """The record's ``event-id`` header as one whitespace-free token (``-`` if none)."""
    for key, value in record.headers:
        if key == "event-id" and value is not None:
            # One token per field: the log is split on whitespace.
            return "".join(value.decode("utf-8", "replace").split()) or "-"
    return "-"
