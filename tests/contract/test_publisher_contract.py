"""The publisher contract, run over the fake publisher and KafkaPublisher on the real broker.

What the dead-letter path relies on (:class:`kinbox.core.publisher.Publisher`): a
record counts as sent only once a flush returned, and then it is in the topic
as it was sent; a flush that fails raises, and nothing of it counts.
"""

from __future__ import annotations

import pytest

from kinbox.core.errors import TransportError
from tests.contract.kafka_sides import PublisherSide


def test_a_flushed_record_is_in_its_topic_as_sent(producer: PublisherSide) -> None:
    topic = producer.topic()
    headers: list[tuple[str, bytes | None]] = [("a", b"1"), ("none", None), ("a", b"2")]
    producer.publisher.send(topic, b"key", b"value", headers)
    producer.publisher.send(topic, None, None, [])
    producer.publisher.flush()
    assert producer.read(topic) == [(b"key", b"value", headers), (None, None, [])]


def test_a_flush_the_broker_refuses_raises_and_counts_nothing_as_delivered(
    producer: PublisherSide,
) -> None:
    # Given a flush holding a good record and one the broker will not take
    topic = producer.topic()
    producer.publisher.send(topic, None, b"good", [])
    producer.send_doomed(topic)
    # When it is flushed, it fails
    with pytest.raises(TransportError):
        producer.publisher.flush()
    # Then the caller sends the good one again, as a rolled-back batch does, and
    # it arrives. (Here the real broker refused both: max.message.bytes bounds
    # a record batch, and both were in one. A good record in another batch would
    # have arrived, and be there twice now: nothing of a failed flush counts as
    # delivered, but it may have been. The fake drops all it held.)
    producer.publisher.send(topic, None, b"good", [])
    producer.publisher.flush()
    values = [value for _, value, _ in producer.read(topic)]
    assert set(values) == {b"good"} and 1 <= len(values) <= 2


def test_a_record_over_the_clients_own_limit_is_refused_at_send(producer: PublisherSide) -> None:
    if producer.name == "fake":
        pytest.skip("FakePublisher has no size limit: it takes any record at send()")
    with pytest.raises(TransportError, match="MSG_SIZE_TOO_LARGE"):
        producer.publisher.send(producer.topic(), None, b"x" * 2_000_000, [])
