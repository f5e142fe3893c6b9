"""The publisher contract, run over the fake publisher and KafkaPublisher on the real broker.

What dead letters and the outbox relay rely on (:class:`kinbox.core.publisher.Publisher`):
every message sent gets one outcome, acknowledged only once it is in the topic
as it was sent; :func:`~kinbox.core.publisher.deliver` returns only when all
of its messages are, and raises otherwise, counting none of them delivered.
"""

from __future__ import annotations

import pytest

from kinbox.core.errors import TransportError
from kinbox.core.publisher import ACKED, OutgoingRecord, deliver, wait
from tests.contract.kafka_sides import PublisherSide


def test_a_delivered_message_is_in_its_topic_as_sent(producer: PublisherSide) -> None:
    topic = producer.topic()
    headers: list[tuple[str, bytes | None]] = [("a", b"1"), ("none", None), ("a", b"2")]
    deliver(producer.publisher, [OutgoingRecord(topic, b"key", b"value", headers)])
    deliver(producer.publisher, [OutgoingRecord(topic, None, None, [])])
    assert producer.read(topic) == [(b"key", b"value", headers), (None, None, [])]


def test_every_message_sent_gets_its_outcome_once(producer: PublisherSide) -> None:
    topic = producer.topic()
    sending = producer.publisher.send(
        [OutgoingRecord(topic, b"a", b"1", []), OutgoingRecord(topic, b"b", b"2", [])]
    )
    assert wait(producer.publisher, sending) == [ACKED, ACKED]
    assert sorted(sending.known) == [0, 1] and sending.done
    # Serving with nothing in flight returns at once and changes nothing.
    producer.publisher.serve(0)
    assert sorted(sending.known) == [0, 1]
    assert [value for _, value, _ in producer.read(topic)] == [b"1", b"2"]


def test_a_delivery_the_broker_refuses_raises_and_counts_nothing_as_delivered(
    producer: PublisherSide,
) -> None:
    # Given a delivery holding a good message and one the broker will not take
    topic = producer.topic()
    good = OutgoingRecord(topic, None, b"good", [])
    # When it is delivered, it fails
    with pytest.raises(TransportError) as failed:
        deliver(producer.publisher, [good, producer.doomed(topic)])
    assert failed.value.retriable
    # Then the caller sends the good one again, as a rolled-back batch does, and
    # it arrives. (Here the real broker refused both: max.message.bytes bounds
    # a record batch, and both were in one. A good message in another batch would
    # have arrived, and be there twice now: nothing of a failed delivery counts
    # as delivered, but it may have been. The fake drops all it held.)
    deliver(producer.publisher, [good])
    values = [value for _, value, _ in producer.read(topic)]
    assert set(values) == {b"good"} and 1 <= len(values) <= 2


def test_a_message_over_the_clients_own_limit_is_refused_at_send(producer: PublisherSide) -> None:
    if producer.name == "fake":
        pytest.skip("FakePublisher has no size limit: it takes any message at send()")
    big = OutgoingRecord(producer.topic(), None, b"x" * 2_000_000, [])
    [refused] = producer.publisher.send([big]).outcomes
    assert refused is not None and not refused.ok and not refused.outage
    assert "MSG_SIZE_TOO_LARGE" in (refused.error or "")
    with pytest.raises(TransportError, match="MSG_SIZE_TOO_LARGE"):
        deliver(producer.publisher, [big])
