"""Offsets the database has committed and Kafka not yet: the runner's bookkeeping.

An offset enters here only after the transaction that applied (or recorded)
every event below it has committed, so whatever this module commits to Kafka
is safe (docs/design.md invariant 2). Leaving is the other half of the rule: a
partition that is revoked gets one synchronous commit, and a partition that
is lost gets none — another member owns it already.

While the worker runs, offsets are committed *asynchronously*
(:meth:`Offsets.commit`): the polling thread sends them and goes on, and the
broker's answer comes back through a later poll (:meth:`Offsets.answered`).
One such commit is in flight at a time; the next carries the latest offsets
once the answer came. The broker serves a member's requests to its group
coordinator one at a time, on one connection, and a Kafka 4 coordinator
holds each commit for its append linger (``group.coordinator.append.linger.ms``,
5 ms) before it answers: about 150 commits a second at most. A commit per
batch — 300 to 600 a second at 1,000 events/s in batches of one to three —
queued thousands of them, the member's heartbeats waited behind the queue,
and after ``session.timeout.ms`` the member lost its partitions (and waited
minutes for the queued requests to time out before it rejoined). So commits
follow the broker's pace, each offset at most one round trip late; an
answer that never comes (:data:`ANSWER_WAIT`) does not stop them.
An offset stays pending until the broker has confirmed it, so a failed
commit is simply sent again by the next turn — but only while the partition
is this member's: a revoke or a loss calls :meth:`Offsets.forget`, and a
late answer for a forgotten partition finds nothing to retry. So a retry
never lands on a new owner. (A commit sent before the revoke may still be
on its way; it carries an offset the database had committed, the broker
handles it before this member's rejoin — same connection, in order — and
the revoke's own synchronous commit follows it.)

Markers: a transactional producer's commit (or abort) marker takes an
offset of its own and is no record, so ``last offset + 1`` stops one short
of it, and a partition whose transactions all committed would show a lag
of one for ever. So a partition's *position* (the consumer's next offset,
past the markers) is committed instead, under one rule: only once every
record the Kafka client has returned for the partition is *settled* (its
outcome final in the database: applied, a duplicate or dead-lettered) —
then everything below the position is settled or no record at all. What
the client returned is the transport's count
(:meth:`~kinbox.core.transport.Transport.handed`), taken as each client
call returns, not the records the runner has seen: librdkafka serves
rebalance callbacks inside its calls, so a revoke served inside a poll meets
records an earlier call of that poll returned, with the position past them,
before the poll returns them to the runner. The transport then drops them (their
assignment ended), and the offset the revoke committed lies below them:
their next owner reads them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from kinbox.core.errors import FatalTransportError, TransportError
from kinbox.core.transport import Partition, Transport

log = logging.getLogger(__name__)

# A commit that keeps failing (an authorization error, a long outage) is tried
# every turn; say so once in a while, not ten times a second.
_WARN_EVERY = 30.0

ANSWER_WAIT = 30.0
"""Seconds an asynchronous commit may go unanswered before the next one is sent all the same."""


class Offsets:
    """The next offset to commit per partition, and committing it.

    Args:
        transport: where offsets are committed.
    """

    def __init__(self, transport: Transport, clock: Callable[[], float] = time.monotonic) -> None:
        self._transport = transport
        self._clock = clock
        self._sent_at = 0.0
        self._pending: dict[Partition, int] = {}
        # Sent asynchronously and not answered yet: not sent again meanwhile.
        self._sent: dict[Partition, int] = {}
        self._fatal: FatalTransportError | None = None
        # Per partition, for stepping over markers: the offset after the last
        # record settled, and what this member last committed.
        self._settled: dict[Partition, int] = {}
        self._committed: dict[Partition, int] = {}
        self._last_warning = -_WARN_EVERY

    def advance(self, tp: Partition, next_offset: int) -> None:
        """Record that every event of ``tp`` below ``next_offset`` is committed in the DB."""
        # max(): an older result (a revoke's wait, then the loop) never moves it back.
        self._pending[tp] = max(self._pending.get(tp, 0), next_offset)
        self._settled[tp] = max(self._settled.get(tp, 0), next_offset)

    def forget(self, tp: Partition) -> None:
        """Drop ``tp``'s pending offset: the partition is no longer this member's."""
        for known in (self._pending, self._sent, self._settled, self._committed):
            known.pop(tp, None)

    def _due(self, partitions: Iterable[Partition] | None = None) -> dict[Partition, int]:
        """What to commit now (of ``partitions``, default all): pending, or past markers.

        A partition's position only when every record the client returned
        for it is settled (the rule in the module's docstring); a record put
        back or skipped could lie below it otherwise.
        """
        wanted = None if partitions is None else set(partitions)
        due = {tp: o for tp, o in self._pending.items() if wanted is None or tp in wanted}
        settled = {tp: o for tp, o in self._settled.items() if wanted is None or tp in wanted}
        if not settled:
            return due
        handed = self._transport.handed(list(settled))
        idle = [tp for tp, o in settled.items() if tp in handed and o >= handed[tp]]
        if not idle:
            return due
        try:
            positions = self._transport.positions(idle)
        except FatalTransportError:
            raise
        except TransportError as exc:
            log.debug("reading positions failed, committing without them: %s", exc)
            return due
        for tp, position in positions.items():
            if position > max(due.get(tp, 0), self._committed.get(tp, 0)):
                due[tp] = position
        return due

    def commit(self) -> None:
        """Send every offset due and not already on its way, asynchronously.

        Nothing is sent while an earlier commit waits for its answer (for up
        to :data:`ANSWER_WAIT`): see the module's docstring.

        Raises:
            FatalTransportError: the consumer is fatally broken (refused now,
                or an earlier commit's answer said so); no turn can commit
                again, so the worker must end.
        """
        if self._fatal is not None:
            raise self._fatal
        if self._sent and self._clock() - self._sent_at < ANSWER_WAIT:
            return
        offsets = {tp: o for tp, o in self._due().items() if self._sent.get(tp) != o}
        if not offsets:
            return
        try:
            self._transport.commit(offsets, asynchronous=True)
        except FatalTransportError:
            raise
        except TransportError as exc:
            self._warn(exc)
            return
        self._sent.update(offsets)
        self._sent_at = self._clock()

    def queued(self) -> bool:
        """Whether a commit is in flight and offsets settled since wait for its answer.

        The answer arrives inside a poll, and an idle poll returns only at its
        timeout: the runner polls in short slices meanwhile, so the newest
        offsets go out one round trip late, not one idle poll late.
        """
        if not self._sent:
            return False
        return any(self._sent.get(tp) != o for tp, o in self._pending.items())

    def answered(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        """The broker's answer to an asynchronous commit of ``offsets``.

        Confirmed offsets stop being pending. Failed ones stay pending, so
        the next :meth:`commit` sends them again — also when the broker
        rejected the commit outright: in a cooperative rebalance a commit
        sent between its two phases gets ILLEGAL_GENERATION although this
        member keeps the partition, and dropping the offset would leave it
        uncommitted until the next record arrives. A partition this member
        no longer owns was forgotten, so nothing of it is retried.
        """
        for tp, offset in offsets.items():
            if self._sent.get(tp) != offset:
                continue  # forgotten meanwhile, or a later offset is on its way
            del self._sent[tp]
            if error is None:
                self._confirmed(tp, offset)
        if isinstance(error, FatalTransportError):
            self._fatal = error
        elif error is not None:
            self._warn(error)
        else:
            self._last_warning = -_WARN_EVERY

    def commit_now(self) -> None:
        """Commit every offset due synchronously (at shutdown); on failure keep them.

        Raises:
            FatalTransportError: the consumer is fatally broken.
        """
        offsets = self._due()
        if not offsets:
            return
        try:
            self._transport.commit(offsets)
        except FatalTransportError:
            raise
        except TransportError as exc:
            self._warn(exc)
            return
        self._last_warning = -_WARN_EVERY
        for tp, offset in offsets.items():
            self._confirmed(tp, offset)

    def commit_leaving(self, partitions: Iterable[Partition]) -> None:
        """Commit the offsets due of ``partitions`` once, synchronously, as they are revoked."""
        offsets = self._due(partitions)
        if not offsets:
            return
        try:
            self._transport.commit(offsets)
        except TransportError as exc:
            # Whatever the reason, the partition is leaving: never retry this
            # commit onto the next owner. It re-reads from the last committed
            # offset and the inbox suppresses the repeats.
            log.warning("offset commit on revoke dropped: %s", exc)

    def _confirmed(self, tp: Partition, offset: int) -> None:
        """The broker holds ``offset`` for ``tp``: it is no longer pending."""
        self._committed[tp] = max(self._committed.get(tp, 0), offset)
        # A batch may have advanced it meanwhile (from a revoke's wait).
        if self._pending.get(tp, offset) <= offset:
            self._pending.pop(tp, None)

    def _warn(self, exc: TransportError) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY:
            self._last_warning = now
            kind = "failed" if exc.retriable else "rejected by the broker"
            log.warning("offset commit %s, kept for the next try: %s", kind, exc)
