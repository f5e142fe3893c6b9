"""The dead-letter topics, checked before the worker takes its first record.

A dead letter the broker never accepts would hold its partition; most causes
are known before any record arrives, so the worker checks them at start and
refuses to run (configuration error, exit 2) rather than discover them on the
first poison event:

- the topic does not exist and cannot be created (no CREATE permission, a
  creation policy, auto-creation off and no admin rights);
- the worker may not WRITE to it (when the broker reports authorised
  operations, KIP-430);

A missing dead-letter topic is created here, with the source topic's
partition count and room for the source's largest record plus kinbox's
headers, so a record that was accepted upstream can always be dead-lettered.
The check also returns each dead-letter topic's record size limit, which
:func:`kinbox.core.letter.headers` uses to keep the ``kinbox.dlq.*`` headers
from pushing a record over it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not re-exported in the stubs
    AclOperation,
    AdminClient,
    ConfigResource,
)
from confluent_kafka.cimpl import NewTopic

from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, TransportError
from kinbox.kafka.errors import create_client, translate
from kinbox.kafka.producer_config import producer_config

log = logging.getLogger(__name__)

BROKER_DEFAULT_MAX_BYTES = 1_048_588
"""Kafka's default ``max.message.bytes`` of a topic (and ``message.max.bytes`` of a broker)."""

HEADROOM_BYTES = 16 * 1024
"""What a dead-letter topic kinbox creates allows above its source topic: room for the headers."""

_MAX_BYTES = "max.message.bytes"
# Answers of CreateTopics that mean "you may not / the cluster will not": a
# configuration problem to fix before the worker can run, never a retry.
_REFUSED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_PARTITIONS,
        KafkaError.TOPIC_EXCEPTION,
    }
)
_MAY_WRITE = frozenset({AclOperation.WRITE, AclOperation.ALL})


@dataclass(frozen=True)
class DeadLetterTopic:
    """What the worker knows of one dead-letter topic after the check."""

    name: str
    source: str
    max_bytes: int
    """The largest record the topic accepts (its ``max.message.bytes``)."""
    created: bool = False


def check_dead_letter_topics(
    settings: Settings, targets: Mapping[str, str], timeout: float = 30.0
) -> dict[str, DeadLetterTopic]:
    """Make sure every dead-letter topic exists (creating it if needed) and may be written.

    Args:
        settings: the worker's settings (bootstrap servers, ``-X`` overrides).
        targets: source topic -> its dead-letter topic.
        timeout: how long to wait for the cluster to answer, in seconds.

    Returns:
        Dead-letter topic name -> what was found.

    Raises:
        ConfigurationError: a dead-letter topic is missing and cannot be
            created, or the worker may not write to it.
        TransportError: the cluster did not answer within ``timeout``.
    """
    if not targets:
        return {}
    admin = _admin(settings)
    deadline = time.monotonic() + timeout
    topics = _wait_for_metadata(admin, deadline)
    missing = sorted({dlq for dlq in targets.values() if dlq not in topics})
    sources = sorted(set(targets) | set(targets.values()))
    limits = _max_bytes(admin, [t for t in sources if t in topics], deadline)
    created, meanwhile = _create(admin, missing, targets, topics, limits, deadline)
    _wait_until_known(admin, created, deadline)
    # A topic another member created meanwhile (members of one worker start
    # together) may be as new as one created here, or one this worker may not
    # even DESCRIBE (it is then missing from the metadata for good): the
    # writability check asks again while a broker does not know it yet, and
    # says which permission is missing.
    _check_writable(admin, sorted(set(targets.values())), deadline)
    limits.update(_max_bytes(admin, created + meanwhile, deadline))
    found = {}
    for source, dlq in targets.items():
        found[dlq] = DeadLetterTopic(
            dlq, source, limits.get(dlq, BROKER_DEFAULT_MAX_BYTES), dlq in created
        )
        source_limit = limits.get(source)
        if source_limit is not None and found[dlq].max_bytes < source_limit:
            log.warning(
                "dead-letter topic %r accepts records up to %d bytes, its source %r up to %d: "
                "a larger record cannot be dead-lettered and would hold its partition; raise "
                "%r's max.message.bytes",
                dlq, found[dlq].max_bytes, source, source_limit, dlq,
            )  # fmt: skip
    return found


def _admin(settings: Settings) -> AdminClient:
    config = producer_config(settings)
    # An admin client is a plain client: none of the producer's delivery settings.
    for key in ("enable.idempotence", "acks", "message.timeout.ms"):
        config.pop(key, None)
    return create_client(AdminClient, config, "the admin client")


def _remaining(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def _wait_for_metadata(admin: AdminClient, deadline: float) -> dict[str, int]:
    """Topic -> partition count, retrying until the cluster answers or ``deadline``."""
    while True:
        try:
            meta = admin.list_topics(timeout=min(5.0, _remaining(deadline)))
            return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}
        except KafkaException as exc:
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"checking the dead-letter topics: the cluster did not answer: {exc}",
                    retriable=True,
                ) from exc
            log.info("waiting for the Kafka cluster to check the dead-letter topics: %s", exc)
            time.sleep(1.0)


def _wait_until_known(admin: AdminClient, topics: list[str], deadline: float) -> None:
    """Wait until the cluster's metadata has the topics just created.

    CreateTopics returns before every broker knows the new topic; asked
    about it at once, a broker answers UNKNOWN_TOPIC_OR_PART.
    """
    pending = set(topics)
    while pending:
        try:
            meta = admin.list_topics(timeout=min(5.0, _remaining(deadline)))
            pending -= {name for name, t in meta.topics.items() if t.error is None}
        except KafkaException as exc:
            log.debug("waiting for the new dead-letter topics in the metadata: %s", exc)
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise TransportError(
                f"created dead-letter topic(s) {sorted(pending)}, but the cluster does not "
                "know them yet",
                retriable=True,
            )
        time.sleep(0.2)


def _max_bytes(admin: AdminClient, topics: list[str], deadline: float) -> dict[str, int]:
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in topics]
    out = {}
    for resource, future in admin.describe_configs(resources).items():
        try:
            entries = future.result(timeout=_remaining(deadline))
        except KafkaException as exc:
            # Without DESCRIBE_CONFIGS the broker's default is the best guess;
            # the size check is a safeguard, not a permission the worker needs.
            log.info(
                "cannot read %s's configuration (%s); assuming Kafka's defaults", resource, exc
            )
            continue
        entry = entries.get(_MAX_BYTES)
        if entry is not None and entry.value is not None:
            out[resource.name] = int(entry.value)
    return out


def _create(
    admin: AdminClient,
    missing: list[str],
    targets: Mapping[str, str],
    partitions: Mapping[str, int],
    limits: Mapping[str, int],
    deadline: float,
) -> tuple[list[str], list[str]]:
    """Create the ``missing`` topics; return those created and those another client created."""
    if not missing:
        return [], []
    source_of = {dlq: source for source, dlq in targets.items()}
    new = []
    for dlq in missing:
        source = source_of[dlq]
        config: dict[str, Any] = {}
        if source in limits:
            config[_MAX_BYTES] = str(limits[source] + HEADROOM_BYTES)
        # -1: the broker's defaults (num.partitions, default.replication.factor).
        new.append(NewTopic(dlq, partitions.get(source, -1), -1, config=config))
    created: list[str] = []
    meanwhile: list[str] = []
    for name, future in admin.create_topics(new, request_timeout=_remaining(deadline)).items():
        try:
            future.result(timeout=_remaining(deadline))
        except KafkaException as exc:
            err = _error(exc)
            if err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                meanwhile.append(name)  # another member created it meanwhile
                continue
            if err is not None and err.code() in _REFUSED:
                raise ConfigurationError(
                    f"dead-letter topic {name!r} (of {source_of[name]!r}) does not exist and "
                    f"cannot be created: {err.str()} ({err.name()}). Create it, grant CREATE "
                    "and WRITE on it, or name another with @handler(..., dead_letter_topic=...)"
                ) from exc
            raise translate(f"creating dead-letter topic {name!r}", exc) from exc
        log.info("created dead-letter topic %r for %r", name, source_of[name])
        created.append(name)
    return created, meanwhile


def _error(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


def _check_writable(admin: AdminClient, topics: list[str], deadline: float) -> None:
    pending = topics
    while pending:
        pending = _check_writable_once(admin, pending, deadline)
        if pending:
            time.sleep(0.2)


def _check_writable_once(admin: AdminClient, topics: list[str], deadline: float) -> list[str]:
    """Check ``topics``; return those a broker did not know yet, to ask again (until deadline).

    A topic just created is unknown to some brokers of a cluster for a
    moment, and the broker answering need not be the one that listed it:
    also one another member created at the same moment (this one's
    creation then found it existing, and did not wait for it).
    """
    try:
        futures = admin.describe_topics(TopicCollection(topics), include_authorized_operations=True)
    except KafkaException as exc:
        raise translate("describing the dead-letter topics", exc) from exc
    unknown = []
    for name, future in futures.items():
        try:
            description = future.result(timeout=_remaining(deadline))
        except KafkaException as exc:
            err = _error(exc)
            if (
                err is not None
                and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                and time.monotonic() < deadline
            ):
                unknown.append(name)
                continue
            if err is not None and err.code() in _REFUSED:
                raise ConfigurationError(
                    f"not authorized to use dead-letter topic {name!r}: {err.str()} "
                    f"({err.name()}); a poison event could never be dead-lettered: grant "
                    "DESCRIBE and WRITE on it"
                ) from exc
            raise translate(f"describing dead-letter topic {name!r}", exc) from exc
        allowed = description.authorized_operations
        # None: the broker did not say (no authorizer, or an old broker).
        if allowed is not None and not _MAY_WRITE.intersection(allowed):
            raise ConfigurationError(
                f"not authorized to write to dead-letter topic {name!r}: a poison event "
                "could never be dead-lettered; grant WRITE on it"
            )
    return unknown
