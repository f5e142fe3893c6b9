"""``kinbox worker --processes N``: N group members, one process each, and their supervisor.

- **Members** are spawned processes (a fresh interpreter each: librdkafka's
  threads do not survive a fork). Each loads the app itself and runs one
  consumer, exactly as ``kinbox worker`` with one process does.
- **They die with the supervisor.** Each member asks the kernel for SIGTERM
  when the supervisor dies (:func:`kinbox.ops.lifeline.die_with_parent`), so a
  supervisor killed even with SIGKILL leaves no member consuming on its own;
  each stops as on a SIGTERM of its own (the batch in hand, then its offsets).
- **Static membership.** With ``-X group.instance.id=svc``, member *i* is
  ``svc-i`` (:meth:`~kinbox.core.config.Settings.for_member`): one static id
  names one member, so N processes sharing it would fence each other.
- **Signals.** SIGTERM/SIGINT to the supervisor is forwarded to every member
  as one SIGTERM per signal received: the first stops them gracefully, a
  second makes them exit at once, as for a single worker. Members run in
  their own process groups, so a terminal's Ctrl-C reaches only the supervisor.
- **A member that exits on its own ends the worker.** Whatever the reason —
  a configuration error (2), a fatally failed consumer (7), a crash — the
  supervisor stops the other members gracefully and exits with that member's
  status (128 + N if signal N killed it). A partial set of members that
  carries on hides the failure; an exit lets the service manager see the
  status and restart the whole worker.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Mapping, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from kinbox.ops.exits import guard
from kinbox.ops.lifeline import die_with_parent
from kinbox.ops.logs import configure as configure_logging

log = logging.getLogger("kinbox.supervisor")


def supervise(
    target: str, flags: Mapping[str, Any], processes: int, log_level: str, log_format: str = "text"
) -> int:
    """Run ``processes`` members of ``target`` until they stop; return the exit status."""
    ctx = multiprocessing.get_context("spawn")
    supervisor = os.getpid()
    members: list[BaseProcess] = [
        ctx.Process(
            target=member,
            args=(target, dict(flags), log_level, index, supervisor, log_format),
            name=f"kinbox-worker-{index}",
        )
        for index in range(processes)
    ]
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        _terminate(members)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    running: list[BaseProcess] = []
    for process in members:
        if stopping:
            break  # a signal came during start-up: start no more
        process.start()
        running.append(process)
    log.info("supervising %d members: pids %s", processes, ", ".join(str(m.pid) for m in running))
    ended_by: int | None = None
    while running:
        ready = wait([m.sentinel for m in running])
        for process in [m for m in running if m.sentinel in ready]:
            process.join()
            running.remove(process)
            if stopping:
                continue
            ended_by = status(process.exitcode)
            stopping = True
            log.error(
                "member %s (pid %s) exited with status %d on its own; stopping the other %d",
                process.name, process.pid, ended_by, len(running),
            )  # fmt: skip
            _terminate(running)
    if ended_by is not None:
        return ended_by
    return max((status(m.exitcode) for m in members if m.pid is not None), default=0)


def status(exitcode: int | None) -> int:
    """A member's exit status as a shell reports it: a signal N becomes 128 + N."""
    if exitcode is None:
        return 1
    return 128 - exitcode if exitcode < 0 else exitcode


def member(
    target: str,
    flags: dict[str, Any],
    log_level: str,
    index: int,
    parent: int,
    log_format: str = "text",
) -> None:
    """One member: dies with ``parent``, loads the app, runs as group member ``index``."""
    # First: a supervisor that dies from here on takes this member with it.
    die_with_parent(signal.SIGTERM, parent)
    # Own process group: a terminal's Ctrl-C reaches only the supervisor,
    # which forwards one SIGTERM per signal (two would mean "exit at once").
    os.setpgid(0, 0)
    configure_logging(log_level, log_format)
    from kinbox.ops.worker import resolve_target, run

    app, settings = guard(lambda: resolve_target(target, flags))
    guard(lambda: run(app, settings.for_member(index)))


def _terminate(members: Sequence[BaseProcess]) -> None:
    for process in members:
        if process.pid is not None and process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
