"""Whether a topic may be written, asked before its first message goes out.

librdkafka reports a missing topic only in the delivery report, after
``topic.metadata.propagation.max.ms``, by which time later messages of the
same keys in other topics may be acknowledged. Asked first, a missing or
forbidden topic fails its messages before any is produced, so the later
messages of their keys are held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not re-exported in the stubs
    AclOperation,
    AdminClient,
)

from kinbox.core.publisher import Outcome
from kinbox.kafka.deliveries import TOPIC_CODES, outcome
from kinbox.kafka.errors import create_client

AdminFactory = Callable[[dict[str, Any]], AdminClient]

TOPIC_CHECK_WAIT = 2.0
"""Seconds a send waits for the cluster's answer about a topic it has not confirmed yet.

The sender waits meanwhile (the relay's whole lane group), so not long: the
broker asked may be frozen. Without an answer the messages go (as they would
to a confirmed topic), and the topic is not asked about again until a
delivery report refuses it.
"""

_MAY_WRITE = frozenset({AclOperation.WRITE, AclOperation.ALL})
# The admin client is a plain client: without these it asks for no producer id.
_PRODUCER_ONLY = ("enable.idempotence", "enable.gapless.guarantee", "acks", "message.timeout.ms")


class TopicChecks:
    """The topics one producer confirmed (or got no answer about), and how to ask about others.

    Args:
        config: the producer's configuration; the admin client gets it too,
            without the producer's own settings.
        admin_factory: creates the admin client that asks whether a topic
            may be written (``None``: don't ask).
        timeout: how long to wait for each answer, in seconds.
        what: names the producer in a configuration error.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        admin_factory: AdminFactory | None,
        timeout: float,
        what: str,
    ) -> None:
        self._config = config
        self._admin_factory = admin_factory
        self._admin: AdminClient | None = None  # made when first needed
        self._timeout = timeout
        self._what = what
        # Topics the broker confirmed, or left unanswered (see refused()).
        self._writable: set[str] = set()

    def refused(self, producer: Producer, topics: set[str]) -> dict[str, Outcome]:
        """Ask about ``topics`` not yet confirmed; return those refused as a whole.

        So is one this client may see but not write (:meth:`_write_denied`).
        A question the cluster leaves unanswered (:data:`TOPIC_CHECK_WAIT`)
        is not asked again at every send: each time, the sender would wait.
        """
        refused: dict[str, Outcome] = {}
        for topic in sorted(topics - self._writable):
            try:
                metadata = producer.list_topics(topic, timeout=self._timeout)
            except KafkaException:
                # No answer (the broker asked is down or frozen): the messages go, and
                # a refusal in their delivery reports has the topic asked about again.
                self._writable.add(topic)
                continue
            found = metadata.topics.get(topic)
            error = found.error if found is not None else None
            if found is not None and error is None:
                denied = self._write_denied(topic)
                if denied is None:
                    self._writable.add(topic)
                else:
                    refused[topic] = denied
            elif error is not None and error.code() in TOPIC_CODES:
                refused[topic] = outcome(error)
        return refused

    def forget(self, topic: str) -> None:
        """Ask about ``topic`` again before its next messages go (a report refused it)."""
        self._writable.discard(topic)

    def _write_denied(self, topic: str) -> Outcome | None:
        """The outcome of ``topic``'s messages if the broker says they may not be written.

        A topic the client may DESCRIBE but not WRITE looks fine in the
        metadata; the refusal comes only in the delivery report. The broker
        says which operations are allowed (KIP-430), so ask it. No answer
        (no authorizer, an old broker, a timeout) means go ahead: producing
        reports a refusal anyway.
        """
        if self._admin_factory is None:
            return None
        if self._admin is None:
            config = {k: v for k, v in self._config.items() if k not in _PRODUCER_ONLY}
            self._admin = create_client(
                self._admin_factory, config, f"the admin client of {self._what}"
            )
        try:
            futures = self._admin.describe_topics(
                TopicCollection([topic]), include_authorized_operations=True
            )
            allowed = futures[topic].result(timeout=self._timeout).authorized_operations
        except (KafkaException, TimeoutError):
            return None
        if allowed is None or _MAY_WRITE.intersection(allowed):
            return None
        reason = f"not authorized to write to topic {topic!r} (the broker's ACLs)"
        return outcome(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, reason))
