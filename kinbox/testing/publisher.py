"""An in-memory :class:`~kinbox.core.publisher.Publisher`: :class:`FakePublisher`."""

from __future__ import annotations

from collections.abc import Sequence

from kinbox.core.errors import TransportError
from kinbox.core.record import Record


class FakePublisher:
    """A producer whose broker acknowledges everything sent at each :meth:`flush`.

    State, readable by tests: :attr:`queued` (sent, not flushed yet),
    :attr:`acked` (acknowledged, in order), :attr:`closed`.

    Knob: ``fail_flushes``, how many next flushes fail with a retriable
    :class:`~kinbox.core.errors.TransportError` (the broker unreachable); what
    they held is dropped, as the real publisher counts none of it delivered.

    Unlike a real producer it refuses nothing at :meth:`send` (a real one
    refuses a record over its ``message.max.bytes`` at once), and a record's
    offset is its index in the batch it was sent in, partition 0.
    """

    def __init__(self) -> None:
        self.queued: list[Record] = []
        self.acked: list[Record] = []
        self.fail_flushes = 0
        self.closed = False

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """See :meth:`~kinbox.core.publisher.Publisher.send`."""
        self.queued.append(Record(topic, 0, len(self.queued), key, value, list(headers)))

    def flush(self) -> None:
        """See :meth:`~kinbox.core.publisher.Publisher.flush`; ``fail_flushes`` applies."""
        queued, self.queued = self.queued, []
        if self.fail_flushes:
            self.fail_flushes -= 1
            raise TransportError("broker unreachable", retriable=True)
        self.acked.extend(queued)

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
