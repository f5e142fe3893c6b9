"""The start-up check of the dead-letter topics, against a cluster whose metadata lags.

CreateTopics returns before the cluster's metadata has the new topic; asked
about it at once, a broker answers UNKNOWN_TOPIC_OR_PART. The members of one
``kinbox worker --processes N`` start together, so the one that creates a
missing dead-letter topic is not always the one that asks about it next.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kinbox.core.config import Settings
from kinbox.kafka import admin

SOURCE, DLQ = "lessons", "lessons.dlq"


def _done(value: Any = None, error: int | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(KafkaException(KafkaError(error)))
    return future


@dataclass
class LaggingCluster:
    """An admin client whose cluster learns of a new topic one metadata read late.

    Another member creates the dead-letter topic between this member's first
    metadata read and its CreateTopics.
    """

    known: set[str] = field(default_factory=lambda: {SOURCE})
    created_elsewhere: bool = False
    lagging: set[str] = field(default_factory=set)

    def list_topics(self, timeout: float) -> Any:
        self.known |= self.lagging  # the metadata catches up with the last read
        self.lagging = set()
        parts = {0: None, 1: None}
        return SimpleNamespace(
            topics={name: SimpleNamespace(error=None, partitions=parts) for name in self.known}
        )

    def describe_configs(self, resources: list[Any]) -> dict[Any, Future[Any]]:
        return {resource: _done({}) for resource in resources}

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, Future[Any]]:
        # Another member's CreateTopics went first: the topic exists, not yet in the metadata.
        self.created_elsewhere = True
        self.lagging = {topic.topic for topic in new}
        return {topic.topic: _done(error=KafkaError.TOPIC_ALREADY_EXISTS) for topic in new}

    def describe_topics(self, topics: Any, include_authorized_operations: bool) -> Any:
        answer = {
            name: _done(SimpleNamespace(authorized_operations=None))
            if name in self.known
            else _done(error=KafkaError.UNKNOWN_TOPIC_OR_PART)
            for name in topics.topic_names
        }
        self.known |= self.lagging  # the next read knows it
        self.lagging = set()
        return answer


def test_a_dead_letter_topic_another_member_just_created_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = LaggingCluster()
    monkeypatch.setattr(admin, "_admin", lambda _settings: cluster)
    settings = Settings(bootstrap_servers="kafka:9092", database_url="postgresql://db/x")
    # When this member finds the topic missing, but another one creates it first
    found = admin.check_dead_letter_topics(settings, {SOURCE: DLQ}, timeout=5)
    # Then it waits until the cluster knows the topic, rather than failing the start
    assert cluster.created_elsewhere
    assert found[DLQ].source == SOURCE and not found[DLQ].created
