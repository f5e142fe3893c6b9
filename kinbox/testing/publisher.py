"""An in-memory :class:`~kinbox.core.publisher.Publisher`: :class:`FakePublisher`."""

from __future__ import annotations

from collections.abc import Sequence

from kinbox.core.publisher import ACKED, Outcome, OutgoingRecord, Sending
from kinbox.core.record import Record

_UNREACHABLE = Outcome("broker unreachable", outage=True)


class FakePublisher:
    """A producer whose broker acknowledges everything sent at each :meth:`serve`.

    State, readable by tests: :attr:`queued` (sent, not served yet),
    :attr:`acked` (acknowledged, in order), :attr:`closed`.

    Knob: ``fail_flushes``, how many next serves fail every message in
    flight as an outage (the broker unreachable): the caller counts none of
    it delivered (:func:`~kinbox.core.publisher.deliver` raises a retriable
    :class:`~kinbox.core.errors.TransportError`), and it is dropped.

    Unlike a real producer it refuses nothing at :meth:`send` (a real one
    refuses a record over its ``message.max.bytes`` at once), and a record's
    offset is its index among those queued, partition 0.
    """

    def __init__(self) -> None:
        self.queued: list[Record] = []
        self.acked: list[Record] = []
        self.fail_flushes = 0
        self.closed = False
        self._sendings: list[Sending] = []

    def send(self, messages: Sequence[OutgoingRecord]) -> Sending:
        """See :meth:`~kinbox.core.publisher.Publisher.send`."""
        for topic, key, value, headers in messages:
            self.queued.append(Record(topic, 0, len(self.queued), key, value, list(headers)))
        sending = Sending(len(messages))
        self._sendings.append(sending)
        return sending

    def serve(self, timeout: float) -> None:
        """See :meth:`~kinbox.core.publisher.Publisher.serve`; ``fail_flushes`` applies."""
        queued, self.queued = self.queued, []
        sendings, self._sendings = self._sendings, []
        outcome = ACKED
        if self.fail_flushes and sendings:
            self.fail_flushes -= 1
            outcome = _UNREACHABLE
        else:
            self.acked.extend(queued)
        for sending in sendings:
            for index in range(len(sending.outcomes)):
                sending.settle(index, outcome)

    def close(self) -> None:
        """See :meth:`~kinbox.core.publisher.Publisher.close`."""
        self.closed = True

    def headers(self, index: int) -> dict[str, str]:
        """The ``kinbox.dlq.*`` headers of the ``index``-th acknowledged record, as text."""
        return {
            k: (v or b"").decode()
            for k, v in self.acked[index].headers
            if k.startswith("kinbox.dlq.")
        }
