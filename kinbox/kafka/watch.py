"""A watch on the consumer's calls into librdkafka: one that never returns is said, then ended.

The runner calls the consumer (poll, commit, pause, seek...) from its polling
thread, and a few of confluent-kafka's calls wait without any timeout:
``Consumer.commit(asynchronous=False)`` waits for the group coordinator's
reply with ``RD_POLL_INFINITE``, and every other call on the same client waits
behind one in progress (the binding serialises calls per client). Fault
scenario 6b (the broker SIGSTOPped past the session timeout, then SIGCONTed)
showed that librdkafka 2.16 can lose that reply for good: its group stays in
``query-coord`` ("no broker available for coordinator query") for minutes
while the commit sits in the dead coordinator's queue, re-timed-out every
``socket.timeout.ms`` and never sent. The member then stops entirely and says
nothing — no poll, so no rebalance callback and none of librdkafka's own log
lines (served by poll too) — which docs/design.md invariant 5 forbids.

No thread can take back a C call that does not return, so :class:`CallWatch`
does what invariant 5 asks of an outage instead: a daemon thread sees the
call in progress, says at WARNING which call has not returned for how long
(with the polling thread's stack), again every ``warn_after``; and once the
call has lasted ``give_up_after`` — the group expelled the member long ago
(``max.poll.interval.ms``) — it hands over to ``on_wedged``: the worker exits
with the fatal-client status, so its supervisor restarts it, and the new
client resumes from the committed offsets (the inbox suppresses repeats).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


class CallWatch:
    """Times the client call in progress; a daemon thread warns, then gives up on it.

    Args:
        warn_after: seconds a call may last before it is reported (WARNING).
        give_up_after: seconds after which ``on_wedged`` is called.
        on_wedged: called (from the watch thread) with the reason; ``None``
            only warns. The worker's ends the process.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        warn_after: float,
        give_up_after: float,
        on_wedged: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._warn_after = warn_after
        self._give_up_after = give_up_after
        self._on_wedged = on_wedged
        self._clock = clock
        # (what, started, thread id), replaced as one tuple: read by the watch thread.
        self._current: tuple[str, float, int] | None = None
        self._warned_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Mark the block as the call ``what`` into the client (``"committing {...}"``)."""
        # Nested (a commit from a rebalance callback inside poll): the outer
        # call is watched again once the inner one returns.
        outer = self._current
        self._current = (what, self._clock(), threading.get_ident())
        try:
            yield
        finally:
            self._current = outer
            self._warned_at = None

    def start(self) -> None:
        """Start the watch thread (idempotent); it checks four times per ``warn_after``."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name="kinbox-kafka-watch", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the watch thread."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._warn_after / 4):
            self.check()

    def check(self) -> None:
        """One look at the call in progress (the watch thread's round; public for tests)."""
        current = self._current
        if current is None:
            return
        what, started, ident = current
        now = self._clock()
        lasted = now - started
        if lasted >= self._give_up_after and self._on_wedged is not None:
            reason = (
                f"the Kafka client has not returned from {what} for {lasted:.0f}s: librdkafka "
                "is stuck (seen after the group coordinator froze) and this worker can neither "
                "consume nor commit; ending it so that a fresh client resumes from the "
                "committed offsets"
            )
            log.error("%s", reason)
            self._on_wedged(reason)
            return
        if lasted < self._warn_after:
            return
        if self._warned_at is not None and now - self._warned_at < self._warn_after:
            return
        self._warned_at = now
        frame = sys._current_frames().get(ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)\n"
        log.warning(
            "the Kafka client has not returned from %s for %.0fs: nothing is consumed or "
            "committed meanwhile; the worker ends at %.0fs unless it returns. Polling thread:\n%s",
            what,
            lasted,
            self._give_up_after,
            stack.rstrip(),
        )
