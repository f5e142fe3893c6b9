"""A worker process's stop, bounded: whatever begins it, the process exits within a deadline.

A worker stops because of a signal, or of an error: a fatally failed
consumer, ``missing_id=fail``, a batch that raised (a middleware hook, a
handler's ``sys.exit()``), a thread it needs that died. The runner then
waits for its batches in flight until the shutdown deadline (less a share
for committing and closing: :mod:`kinbox.consume.runner`), but what comes
after — the consumer's close, the pools' close, the middleware's
``after_worker_stop``, the interpreter's own exit, which joins every thread —
may still wait on something that never answers. :class:`ShutdownBound` is the
backstop: armed by the first reason to stop, it ends the process with that
reason's exit status once ``shutdown_timeout`` has passed. That is safe at
any point: an offset is only ever committed after its database transaction,
and PostgreSQL rolls back the transaction of a connection that closes.

Its timer is a Python thread, which cannot run while another thread is
blocked in C holding the GIL (confluent-kafka's binding does that inside
``Consumer.close()``: :mod:`kinbox.ops.last_resort`). So ``kinbox worker``
also gives it a last resort that needs no Python: the Python timer fires a
moment early (:data:`LAST_RESORT_GRACE`), logs why and exits; if it could not
run, every thread's stack goes to stderr and the C library ends the process,
with the same status, at the bound.

:func:`watch_threads` makes a kinbox thread that dies (an uncaught
exception: the event loop of async handlers, say) an ERROR and a stop, never
a silent end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from kinbox.core.describe import describe
from kinbox.core.errors import ThreadDied

log = logging.getLogger("kinbox.ops.worker")

THREAD_PREFIX = "kinbox-"
"""The name of every thread kinbox starts begins so; only those are watched."""


def exit_at_once(status: int) -> NoReturn:
    """End the process now with ``status``: logs and standard streams flushed, no thread joined."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # Closed, or the reader went away: nothing more to say.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


LAST_RESORT_GRACE = 0.5
"""Seconds (a tenth of the bound at most) the Python timer fires before the last resort."""

LastResort = Callable[[float, int, float], object]
"""Ends the process in ``seconds`` with ``status`` whatever its threads do, first writing their
stacks ``stacks_before`` seconds earlier (:func:`kinbox.ops.last_resort.arm`)."""


class ShutdownBound:
    """Ends the process once a stop has lasted ``timeout`` seconds.

    Args:
        timeout: the longest stop (``shutdown_timeout``).
        give_up: what ends the process, given the status (tests replace it).
        last_resort: armed with the bound and the status as the stop begins,
            it ends the process even if ``give_up`` cannot run (the GIL held
            by a thread blocked in C); ``give_up`` then runs
            :data:`LAST_RESORT_GRACE` early. ``None``: ``give_up`` alone, at
            the bound.
    """

    def __init__(
        self,
        timeout: float,
        give_up: Callable[[int], object] = exit_at_once,
        last_resort: LastResort | None = None,
    ) -> None:
        self._timeout = timeout
        self._give_up = give_up
        self._last_resort = last_resort
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.status: int | None = None
        """The exit status of the first reason to stop, once one came."""

    def begin(self, status: int, why: str) -> None:
        """A stop began, for ``why``: start the clock (only the first call does)."""
        with self._lock:
            if self._timer is not None:
                return
            self.status = status
            grace = 0.0
            if self._last_resort is not None:
                grace = min(LAST_RESORT_GRACE, self._timeout / 10)
                self._last_resort(self._timeout, status, grace / 2)
            self._timer = threading.Timer(self._timeout - grace, self._expired, args=(why,))
            self._timer.daemon = True
            self._timer.name = f"{THREAD_PREFIX}shutdown-bound"
            self._timer.start()

    def _expired(self, why: str) -> None:
        assert self.status is not None
        log.error(
            "shutdown (%s) reached its bound of %.1fs: exiting now with status %d; nothing "
            "more is committed, and what the database had not committed is rolled back",
            why, self._timeout, self.status,
        )  # fmt: skip
        self._give_up(self.status)


def watch_threads(on_death: Callable[[ThreadDied], None]) -> None:
    """Make a kinbox thread that ends on an exception an ERROR and a call of ``on_death``.

    Installs ``threading.excepthook`` for the process; the deaths of threads
    whose names do not begin with :data:`THREAD_PREFIX` go to the hook there
    was before. (A thread that ends on ``SystemExit`` reaches no hook:
    kinbox's own threads turn it into :class:`~kinbox.core.errors.ThreadDied` first.)
    """
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        if thread is None or not thread.name.startswith(THREAD_PREFIX):
            previous(args)
            return
        error = args.exc_value
        what = args.exc_type.__name__ if error is None else describe(error)
        log.error(
            "thread %s died: %s; stopping the worker",
            thread.name,
            what,
            exc_info=None if error is None else (args.exc_type, error, args.exc_traceback),
        )
        if isinstance(error, ThreadDied):
            on_death(error)
            return
        died = ThreadDied(f"thread {thread.name} died: {what}")
        died.__cause__ = error
        on_death(died)

    threading.excepthook = hook
