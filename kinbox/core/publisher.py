"""The producing side of the Kafka seam, free of any driver: what is sent and what became of it.

:class:`Publisher` is what dead letters, ``kinbox dlq replay`` and the outbox
relay depend on. It sends without waiting (:meth:`Publisher.send` returns a
:class:`Sending` at once) and hands over delivery reports when served, so
the relay never waits for a whole batch; :func:`deliver` is the dead-letter
path's all-or-nothing use of it. This module imports no Kafka client:
:class:`~kinbox.kafka.publisher.KafkaPublisher` is the real implementation,
and :mod:`kinbox.testing` has a fake. The consuming side is
:mod:`kinbox.core.transport`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

from kinbox.core.errors import TransportError


class OutgoingRecord(NamedTuple):
    """One Kafka record to send (immutable): its topic, key, value and headers.

    ``headers`` is a list, as the Kafka client takes it: made for this
    message, it is handed over without a copy.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Outcome:
    """The fate of one message: ``error is None`` means acknowledged by the broker.

    ``outage``: Kafka, not the message, failed (the relay never counts it as a
    try of the row). ``topic_failure``: the whole topic is refused (missing,
    not authorized). ``held``: not sent, because an earlier message of its key
    failed. Both of the latter are outages too.
    """

    error: str | None = None
    outage: bool = False
    topic_failure: bool = False
    held: bool = False

    @property
    def ok(self) -> bool:
        """Whether the broker acknowledged the message."""
        return self.error is None


ACKED = Outcome()
HELD = Outcome("not sent: an earlier record of its key failed", outage=True, held=True)


class Sending:
    """The messages of one :meth:`Publisher.send`, and their outcomes as Kafka reports them.

    ``outcomes[i]`` is ``None`` until message ``i`` has its final outcome. Each
    index whose outcome became known is appended to :attr:`known` once, in the
    order they came; the reader takes them from there.
    """

    def __init__(self, count: int) -> None:
        self.outcomes: list[Outcome | None] = [None] * count
        self.known: list[int] = []
        """Indexes whose outcome came since the reader last cleared this list."""
        self._unknown = count

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Sending:
        """A sending whose every outcome is known already."""
        sending = cls(len(outcomes))
        for index, outcome in enumerate(outcomes):
            sending.settle(index, outcome)
        return sending

    @property
    def done(self) -> bool:
        """Whether every message has its final outcome."""
        return self._unknown == 0

    def settle(self, index: int, outcome: Outcome) -> None:
        """Give message ``index`` its final ``outcome`` (a second one is ignored)."""
        if self.outcomes[index] is None:
            self.outcomes[index] = outcome
            self.known.append(index)
            self._unknown -= 1


class Publisher(Protocol):
    """Sends messages without waiting; their outcomes come later, through :meth:`serve`."""

    def send(self, messages: Sequence[OutgoingRecord]) -> Sending:
        """Start sending ``messages`` (in order); return at once.

        Messages refused before they leave (the topic refused as a whole, one
        over the client's size limit, one held behind a refused message of
        its key) have their outcome in the returned :class:`Sending` already.
        """
        ...

    def serve(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for delivery reports; fill in the sendings' outcomes.

        Returns at once when nothing is in flight. A message gets an outcome
        in bounded time: its report, or an outage outcome when none came.
        """
        ...

    def close(self) -> None:
        """Flush what is left (best effort) and release the client."""
        ...


@runtime_checkable
class Siblings(Protocol):
    """A publisher that can make another like it (a relay's second lane group)."""

    def sibling(self) -> Publisher:
        """A new publisher with this one's settings and a client of its own."""
        ...


def wait(publisher: Publisher, sending: Sending) -> list[Outcome]:
    """Serve ``publisher`` until every message of ``sending`` has its outcome; return them."""
    while not sending.done:
        publisher.serve(1.0)
    return [outcome for outcome in sending.outcomes if outcome is not None]


def deliver(publisher: Publisher, messages: Iterable[OutgoingRecord]) -> None:
    """Send ``messages`` and return only once the broker acknowledged every one.

    Each is sent as it comes (``messages`` may be read lazily); one refused
    at once raises then, before the next is sent.

    Raises:
        TransportError: retriable; a message was refused or not acknowledged,
            and the caller must treat none of them as delivered.
    """
    sendings: list[tuple[OutgoingRecord, Sending]] = []
    for message in messages:
        sending = publisher.send([message])
        refused = sending.outcomes[0]
        if refused is not None and not refused.ok:
            raise TransportError(f"producing to {message.topic!r}: {refused.error}", retriable=True)
        sendings.append((message, sending))
    failed = [
        f"{message.topic}: {outcome.error}"
        for message, sending in sendings
        for outcome in wait(publisher, sending)
        if not outcome.ok
    ]
    if failed:
        raise TransportError(f"produce failed: {'; '.join(failed[:3])}", retriable=True)
