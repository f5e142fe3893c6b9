"""An event loop on a thread of its own, which blocking code hands coroutines to.

The batch code is synchronous: it runs on the worker's batch thread(s).
Async handlers, and the ``AsyncConnection`` they work on, need an event
loop; :class:`LoopThread` runs one for the whole worker, and
:meth:`LoopThread.run` submits a coroutine to it — a whole inbox
transaction (:mod:`kinbox.store.awaiting`) — and blocks until it is done
(``asyncio.run_coroutine_threadsafe``). The calling thread's context
variables go with the coroutine (the callback that starts its task is made
in the caller's context), so what a middleware set around the call — the
event's cause, a tracing span — is what the handler sees.

Exactly one thread uses a given connection at a time: only the loop does.

The loop's thread must never end while a call waits on it: nothing would
ever answer that call. If it does end — something run on the loop raised
``SystemExit`` or ``KeyboardInterrupt``, which asyncio lets through
``run_forever`` — the thread raises :class:`~kinbox.core.errors.ThreadDied` (so
the process's ``threading.excepthook`` hears of it), and every call waiting
on it, or made later, raises it too, within :data:`LIVENESS_CHECK`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from kinbox.core.describe import describe
from kinbox.core.errors import ThreadDied

T = TypeVar("T")

LIVENESS_CHECK = 1.0
"""Seconds a call waits on the loop between two looks at whether its thread still lives."""


class LoopThread:
    """A daemon thread running one asyncio event loop until :meth:`stop`.

    Args:
        name: the thread's name (seen in thread dumps).
    """

    def __init__(self, name: str = "kinbox-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._died: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        except BaseException as exc:
            # Not a stop(): what still runs on the loop is left to the
            # process's exit, and the calls waiting on it are told.
            self._died = exc
            self._loop.close()
            raise ThreadDied(self._death()) from exc
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def _death(self) -> str:
        assert self._died is not None
        return (
            f"the event loop of async handlers ({self._thread.name}) died: "
            f"{describe(self._died)}; no async handler can run any more"
        )

    @property
    def running(self) -> bool:
        """Whether the loop still takes coroutines."""
        return self._died is None and self._thread.is_alive() and not self._loop.is_closed()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and return its result (or raise its exception).

        Raises:
            RuntimeError: called from the loop's own thread (it would wait
                for itself forever), or the loop is stopped.
            ThreadDied: the loop's thread died, before the call or while it
                waited (the coroutine's fate is then unknown: it ran no
                further than the loop did).
        """
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("LoopThread.run called from its own loop: it would never return")
        if not self.running:
            coroutine.close()
            if self._died is not None:
                raise ThreadDied(self._death()) from self._died
            raise RuntimeError("the event loop of async handlers is stopped")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        while True:
            try:
                return future.result(LIVENESS_CHECK)
            except concurrent.futures.TimeoutError:
                if future.done():  # the coroutine's own TimeoutError, or it ended just now
                    return future.result()
            if not self.running:
                # A stop() under a running call ends here too: no answer can come.
                raise ThreadDied(
                    self._death()
                    if self._died is not None
                    else "the event loop of async handlers stopped while a call waited on it"
                ) from self._died

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop once what is running now has returned, and wait for the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # the loop died and closed meanwhile
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
