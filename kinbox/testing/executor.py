"""An :class:`~concurrent.futures.Executor` that runs each job at once: :class:`InlineExecutor`.

The runner applies partition batches on worker threads. Given this executor
instead (``Runner(..., executor=InlineExecutor())``), every batch runs on the
calling thread the moment it is started, so each
:meth:`~kinbox.consume.runner.Runner.turn` applies and settles what it polled
before it returns: a test steps the loop and looks at the result, with no
thread to wait for. (Batches of different partitions then run one after the
other, and a slow handler holds the polling thread.)
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each submitted job on the calling thread, before :meth:`submit` returns."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` now; return its (already completed) future."""
        future: Future[T] = Future()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # the future carries it, as a thread pool's would
            future.set_exception(exc)
        else:
            future.set_result(result)
        return future
