"""Upkeep as scheduled tasks: each has a name, an interval and a next-due time.

psycopg_pool keeps its pool's upkeep as small tasks on a scheduler, run by a
worker that logs a failing task and carries on. The relay's upkeep — lane
balancing, cleanup of old sent rows — is the same kind of work, but it must
run on the relay's work connection *between* batches: a lane may be released
only while none of its rows is in flight. So this scheduler owns no thread;
the relay's loop calls :meth:`Scheduler.run_due` between rounds of batches and
hands it the connection the tasks run on.

The rules:

- :meth:`~Scheduler.run_due` runs the tasks due when it is called, each once,
  the earliest due first (ties in the order they were added). A task that
  falls due while others run waits for the next call.
- After a run, whether it succeeded or not, a task is next due ``interval``
  after the run *ended*. A task slower than its interval therefore still
  leaves the loop a round of batches between two of its runs: it delays the
  loop, it never starves it.
- A task that raises is logged with its traceback and tried again one
  interval later; the loop goes on. Only an exception that ``passes`` accepts
  goes through (after the task is rescheduled): for the relay, PostgreSQL
  gone, which it answers by reconnecting.
- ``should_stop`` is asked before each task, so a stop requested during
  upkeep runs no further task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kinbox.core.errors import ConfigurationError

log = logging.getLogger(__name__)

C = TypeVar("C")


@dataclass
class Task(Generic[C]):
    """A named piece of upkeep, run every ``interval`` seconds with the loop's context."""

    name: str
    interval: float
    run: Callable[[C], object]
    due: float  # the clock reading from which the task is due


class Scheduler(Generic[C]):
    """Periodic tasks, run by the caller's loop when due (see the module doc)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        passes: Callable[[Exception], bool] = lambda _exc: False,
    ) -> None:
        self._clock = clock
        self._passes = passes
        self._tasks: dict[str, Task[C]] = {}  # in the order added: the tie-break

    def add(
        self, name: str, interval: float, run: Callable[[C], object], *, delay: float = 0.0
    ) -> Task[C]:
        """Run ``run`` every ``interval`` seconds, first ``delay`` seconds from now.

        A task of the same name is replaced (and goes last among ties).

        Raises:
            ConfigurationError: ``interval`` is not positive or ``delay`` is negative.
        """
        if not interval > 0 or not delay >= 0:
            raise ConfigurationError(
                f"task {name!r}: interval={interval!r}, delay={delay!r} is not allowed: "
                "use interval > 0 and delay >= 0"
            )
        self._tasks.pop(name, None)
        task = Task(name, interval, run, self._clock() + delay)
        self._tasks[name] = task
        return task

    def remove(self, name: str) -> None:
        """Unschedule the task ``name`` (nothing if there is none)."""
        self._tasks.pop(name, None)

    def get(self, name: str) -> Task[C] | None:
        """The task scheduled as ``name``, if any."""
        return self._tasks.get(name)

    def run_due(self, context: C, *, should_stop: Callable[[], bool] = lambda: False) -> list[str]:
        """Run each task due now once, earliest first, with ``context``.

        Returns:
            The names of the tasks that ran, in order (failed ones included).

        Raises:
            BaseException: what ``passes`` accepts, from a task; and
                anything that is not an :class:`Exception` (KeyboardInterrupt).
        """
        now = self._clock()
        due = sorted((t for t in self._tasks.values() if t.due <= now), key=lambda t: t.due)
        ran: list[str] = []
        for task in due:
            if should_stop():
                break
            if self._tasks.get(task.name) is not task:
                continue  # removed or replaced by a task that ran before it
            ran.append(task.name)
            try:
                task.run(context)
            except Exception as exc:
                if self._passes(exc):
                    raise
                # Upkeep never ends the loop it serves.
                log.exception("upkeep task %r failed; next try in %.1fs", task.name, task.interval)
            finally:
                # From the end of the run: a slow task cannot be due again at once.
                task.due = self._clock() + task.interval
        return ran
