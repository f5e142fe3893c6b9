"""An event loop on a thread of its own, which blocking code hands coroutines to.

The batch code is synchronous: it runs on the worker's batch thread(s) and
waits for each step. Async handlers, and the ``AsyncConnection`` they work
on, need an event loop; :class:`LoopThread` runs one for the whole worker, and
:meth:`LoopThread.run` submits a coroutine to it and blocks until it is done
(``asyncio.run_coroutine_threadsafe``). The calling thread's context
variables go with the coroutine (the callback that starts its task is made
in the caller's context), so what a middleware set around the call — the
event's cause, a tracing span — is what the handler sees.

Exactly one thread uses a given connection at a time: the batch thread waits
while the loop runs its coroutine, and only then goes on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from kinbox.errors import HandlerCancelled

T = TypeVar("T")


async def awaited(awaitable: Awaitable[T]) -> T:
    """Await a handler's call; a cancellation inside it becomes :class:`HandlerCancelled`."""
    try:
        return await awaitable
    except asyncio.CancelledError as exc:
        raise HandlerCancelled(f"the async handler's coroutine was cancelled: {exc!r}") from exc


class LoopThread:
    """A daemon thread running one asyncio event loop until :meth:`stop`.

    Args:
        name: the thread's name (seen in thread dumps).
    """

    def __init__(self, name: str = "kinbox-loop") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    @property
    def running(self) -> bool:
        """Whether the loop still takes coroutines."""
        return self._thread.is_alive() and not self._loop.is_closed()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and return its result (or raise its exception).

        Raises:
            RuntimeError: called from the loop's own thread (it would wait
                for itself forever), or the loop is stopped.
        """
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("LoopThread.run called from its own loop: it would never return")
        if not self.running:
            coroutine.close()
            raise RuntimeError("the event loop of async handlers is stopped")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop once what is running now has returned, and wait for the thread."""
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
