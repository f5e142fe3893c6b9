"""Who wants each partition paused, and the one place that pauses and resumes it.

Three parts of the loop keep a partition from being fetched: its lane when
full (:mod:`kinbox.consume.lanes`), a failure backing off
(:mod:`kinbox.consume.backoff`) and the circuit breaker
(:mod:`kinbox.consume.breaker`). Each only says what it wants, with its own
:class:`Reason` (:meth:`PauseLedger.want`, :meth:`PauseLedger.release`); the
ledger pauses a partition as the first reason comes and resumes it as the
last one goes, so none of them can undo another's pause.

The ledger keeps what is wanted apart from what the client has paused, and
changes the latter only once the client took the call: a call it refused
raises, and the next :meth:`PauseLedger.sync` (before each poll) tries
again. Only assigned partitions are paused. A partition revoked or lost is
resumed (its pause is this member's own state and must not outlive the
assignment) and forgotten, and a partition assigned starts with no reason
to be paused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence, Set
from enum import Enum

from kinbox.core.errors import TransportError
from kinbox.core.transport import Partition, Transport

log = logging.getLogger(__name__)


class Reason(Enum):
    """Why a partition is wanted paused."""

    LANE = "its lane is full"
    BACKOFF = "a failure backs off"
    BREAKER = "the circuit breaker holds it"


class PauseLedger:
    """The member's assigned partitions, who wants each paused, and what the client has paused.

    Args:
        transport: the consumer; nothing else pauses or resumes it.
    """

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._assigned: set[Partition] = set()
        self._wants: dict[Reason, set[Partition]] = {reason: set() for reason in Reason}
        self._paused: set[Partition] = set()  # what the client has paused, as far as it said
        self._unsure = False  # a call was refused, or a partition came back paused: sync()

    @property
    def assigned(self) -> Set[Partition]:
        """The partitions this member holds now."""
        return self._assigned

    @property
    def paused(self) -> Set[Partition]:
        """The partitions the client has paused (those it refused to resume included)."""
        return self._paused

    def holding(self, reason: Reason) -> Set[Partition]:
        """The partitions ``reason`` wants paused."""
        return self._wants[reason]

    def wanted(self, tp: Partition) -> bool:
        """Whether any reason wants ``tp`` paused."""
        return any(tp in wants for wants in self._wants.values())

    def want(self, reason: Reason, partitions: Iterable[Partition]) -> None:
        """``reason`` wants ``partitions`` paused (those assigned); pause those newly wanted.

        Raises:
            TransportError: the client refused the pause (the wish stays).
        """
        wants = self._wants[reason]
        new = [tp for tp in partitions if tp in self._assigned and tp not in wants]
        wants.update(new)
        self._pause([tp for tp in new if tp not in self._paused])

    def release(self, reason: Reason, partitions: Iterable[Partition] | None = None) -> None:
        """``reason`` no longer wants ``partitions`` (default: any) paused; resume those now free.

        Raises:
            TransportError: the client refused the resume (it stays recorded as paused).
        """
        wants = self._wants[reason]
        if not wants:
            return
        gone = list(wants) if partitions is None else [tp for tp in partitions if tp in wants]
        wants.difference_update(gone)
        self._resume([tp for tp in gone if tp in self._paused and not self.wanted(tp)])

    def assign(self, partitions: Iterable[Partition]) -> None:
        """``partitions`` are this member's now, wanted paused by nobody."""
        for tp in partitions:
            self._drop_wants(tp)
            self._assigned.add(tp)
            if tp in self._paused:
                self._unsure = True  # its resume at the unassign was refused: sync() resumes it

    def unassign(self, partitions: Iterable[Partition]) -> None:
        """``partitions`` were revoked or lost: resume those paused, forget their wants.

        A resume the client refuses is only logged (the partition is going
        either way); it stays recorded as paused, so an assignment of it
        again resumes it.
        """
        leaving = [tp for tp in partitions if tp in self._assigned]
        for tp in leaving:
            self._drop_wants(tp)
            self._assigned.discard(tp)
        paused = [tp for tp in leaving if tp in self._paused]
        if not paused:
            return
        try:
            self._transport.resume(paused)
        except TransportError as exc:
            log.debug("resume on unassign failed: %s", exc)
            return
        self._paused.difference_update(paused)

    def sync(self) -> None:
        """Bring the client in line with the wants, after a refused call or a paused comeback.

        Raises:
            TransportError: the client refused again.
        """
        if not self._unsure:
            return
        self._unsure = False
        wanted = {tp for tp in self._assigned if self.wanted(tp)}
        self._pause([tp for tp in wanted if tp not in self._paused])
        self._resume([tp for tp in self._paused if tp in self._assigned and tp not in wanted])

    def _drop_wants(self, tp: Partition) -> None:
        for wants in self._wants.values():
            wants.discard(tp)

    def _pause(self, partitions: list[Partition]) -> None:
        if partitions:
            self._call(self._transport.pause, sorted(partitions))
            self._paused.update(partitions)

    def _resume(self, partitions: list[Partition]) -> None:
        if partitions:
            self._call(self._transport.resume, sorted(partitions))
            self._paused.difference_update(partitions)

    def _call(
        self, method: Callable[[Sequence[Partition]], None], partitions: list[Partition]
    ) -> None:
        try:
            method(partitions)
        except TransportError:
            self._unsure = True
            raise
