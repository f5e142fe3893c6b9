"""Waiting for a condition that other processes make true: the one poll loop of the tests."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], bool], timeout: float = 60.0, what: str = "", *, interval: float = 0.1
) -> None:
    """Poll ``condition`` every ``interval`` s until it holds; fail naming ``what`` at ``timeout``.

    The condition is asked once more after the deadline has passed, so a slow
    last poll never fails a wait that has in fact been met. An exception from
    the condition (a worker that exited, say) ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or condition}")
        time.sleep(interval)
