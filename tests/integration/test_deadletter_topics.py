"""Dead-letter topics are checked at start, and a dead letter always fits its topic.

Real ``kinbox worker`` processes against the real broker: a missing dead-letter
topic is created with room for its source's largest record; one that cannot be
created, or may not be written, stops the worker at start with the
configuration code; a poison record as large as its topic allows still ends in
the dead-letter topic, with the ``kinbox.dlq.*`` headers cut to fit.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from kinbox.core.config import Settings
from kinbox.core.errors import ServiceError
from kinbox.devstack.kafka import KafkaBroker
from kinbox.devstack.stack import Stack
from kinbox.kafka.admin import HEADROOM_BYTES, DeadLetterTopic, check_dead_letter_topics
from tests.conftest import cannot_start
from tests.support.database import prepare_schema
from tests.support.records import committed, read_topic
from tests.support.topics import create_topic
from tests.support.waiting import wait_for
from tests.support.workers import WorkerFactory, workers

EXIT_CONFIG = 2
POISON_EVERY = 1000  # effect_app: an id ending in a multiple of this is poison


def topic_config(bootstrap: str, topic: str) -> tuple[int, int]:
    """(partitions, max.message.bytes) of ``topic`` as the broker has them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=10)
    return partitions, int(entries["max.message.bytes"].value)


def produce(bootstrap: str, topic: str, items: list[tuple[str, int, bytes]]) -> None:
    """Send ``(event id, partition, value)`` records, all acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 200_000})
    errors: list[Any] = []
    for event_id, partition, value in items:
        producer.produce(
            topic,
            value=value,
            partition=partition,
            headers=[("event-id", event_id.encode())],
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0 and not errors, errors


@pytest.fixture
def factory(stack: Stack, tmp_path: Path) -> Iterator[WorkerFactory]:
    schema = f"dl_{uuid.uuid4().hex[:10]}"
    prepare_schema(stack.database_url, schema)
    with workers(
        stack.bootstrap_servers, stack.database_url, f"g-{schema}", schema, "unset", tmp_path
    ) as made:
        yield made


def poison_run(factory: WorkerFactory, source: str, big: int) -> tuple[list[Any], str]:
    """Two good events and a poison one of ``big`` bytes on partition 1; drain; the DLQ."""
    group = factory.group
    items = [(f"{group}-ev-1", 1, b"{}"), (f"{group}-ev-{POISON_EVERY}", 1, b"x" * big)]
    items.append((f"{group}-ev-2", 1, b"{}"))
    produce(factory.bootstrap, source, items)
    factory.topic = source
    worker = factory.start(
        "w", env={"FAULT_POISON_EVERY": str(POISON_EVERY)}, args=["--max-attempts", "1"]
    )
    wait_for(
        lambda: committed(factory.bootstrap, group, source, 2).get(1, 0) >= 3,
        60,
        "the poison event's partition to move past it",
    )
    assert worker.stop() == 0, worker.log_tail()
    return read_topic(factory.bootstrap, f"{source}.dlq"), worker.log()


def test_a_missing_dead_letter_topic_is_created_with_room_for_the_largest_source_record(
    stack: Stack, factory: WorkerFactory
) -> None:
    # Given a source topic that takes records up to 60 kB and no dead-letter topic
    source = create_topic(
        stack.bootstrap_servers, partitions=2, prefix="dl", config={"max.message.bytes": "60000"}
    )
    # When a worker starts and meets a poison event of 59 kB
    letters, _ = poison_run(factory, source, 59_000)
    # Then the dead-letter topic was created like its source, with headroom
    assert topic_config(stack.bootstrap_servers, f"{source}.dlq") == (2, 60_000 + HEADROOM_BYTES)
    # and the poison event is in it, whole, with every kinbox.dlq.* header
    assert len(letters) == 1 and letters[0].value == b"x" * 59_000
    assert letters[0].header("kinbox.dlq.reason") == "handler-error"
    assert letters[0].header("kinbox.dlq.error.message"), letters[0].headers


def start_together(settings: Settings, source: str, members: int) -> list[DeadLetterTopic]:
    """Run the start-up check of ``members`` members at the same moment; what each found."""
    start = threading.Barrier(members)
    found: list[DeadLetterTopic] = []
    failed: list[BaseException] = []

    def member() -> None:
        start.wait(30)
        try:
            found.extend(check_dead_letter_topics(settings, {source: f"{source}.dlq"}).values())
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=member) for _ in range(members)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failed, failed
    return found


def test_members_starting_together_all_pass_the_check_of_a_missing_dead_letter_topic(
    stack: Stack,
) -> None:
    settings = Settings(
        bootstrap_servers=stack.bootstrap_servers, database_url=stack.database_url,
        group_id="dl-start",
    ).validate()  # fmt: skip
    # A few rounds: the race is between one member's CreateTopics and the others' reads.
    for _ in range(4):
        # Given the members of one worker starting at the same moment, each
        # checking a dead-letter topic that does not exist yet
        source = create_topic(stack.bootstrap_servers, partitions=2, prefix="dl")
        # When they check it, Then every one passes (a topic another member
        # created a moment ago is waited for, never a failed start) and one created it
        found = start_together(settings, source, members=3)
        assert len(found) == 3 and sum(topic.created for topic in found) == 1, found
        assert topic_config(stack.bootstrap_servers, f"{source}.dlq")[0] == 2


def test_headers_are_cut_to_fit_a_dead_letter_topic_that_is_barely_large_enough(
    stack: Stack, factory: WorkerFactory
) -> None:
    # Given a dead-letter topic whose limit leaves room for the record and only
    # about as much again as its essential headers take
    source = create_topic(
        stack.bootstrap_servers, partitions=2, prefix="dl", config={"max.message.bytes": "60000"}
    )
    dlq = f"{source}.dlq"
    create_topic(stack.bootstrap_servers, dlq, 2, config={"max.message.bytes": str(40_000 + 480)})
    # When a poison event of 40 kB is dead-lettered
    letters, log = poison_run(factory, source, 40_000)
    # Then the worker warned at start that larger records could not be dead-lettered
    assert "a larger record cannot be dead-lettered" in log
    # and the record went to the dead-letter topic with where-from and why only
    assert len(letters) == 1 and letters[0].value == b"x" * 40_000
    names = {k for k, _ in letters[0].headers}
    assert {"kinbox.dlq.topic", "kinbox.dlq.offset", "kinbox.dlq.reason"} <= names
    assert "kinbox.dlq.time" not in names, names


# -- a broker of this module's own: a creation it refuses, a write it denies --


@pytest.fixture(scope="module")
def strict_broker() -> Iterator[KafkaBroker]:
    """A broker that creates no topic with its defaults and enforces ACLs."""
    broker = KafkaBroker(
        settings={
            # One node cannot hold 3 replicas: creating with the defaults fails.
            "default.replication.factor": "3",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
        }
    )
    try:
        broker.start()
    except ServiceError as exc:
        cannot_start("a Kafka broker with an authorizer", exc)
    yield broker
    broker.close()


def test_a_dead_letter_topic_that_cannot_be_created_stops_the_worker_at_start(
    strict_broker: KafkaBroker, factory: WorkerFactory
) -> None:
    bootstrap = strict_broker.bootstrap_servers
    factory.topic = create_topic(bootstrap, partitions=1, prefix="dl")
    worker = factory.start("w", bootstrap=bootstrap)
    assert worker.wait(90) == EXIT_CONFIG, worker.log_tail()
    assert f"dead-letter topic '{factory.topic}.dlq'" in worker.log(), worker.log_tail()
    assert "cannot be created" in worker.log(), worker.log_tail()


@pytest.mark.parametrize("may_describe", [False, True], ids=["no-access", "describe-only"])
def test_an_unwritable_dead_letter_topic_stops_the_worker_at_start(
    strict_broker: KafkaBroker, factory: WorkerFactory, may_describe: bool
) -> None:
    bootstrap = strict_broker.bootstrap_servers
    factory.topic = create_topic(bootstrap, partitions=1, prefix="dl")
    dlq = create_topic(bootstrap, f"{factory.topic}.dlq", 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Any ACL on the topic ends "allow everyone": only what is granted is allowed.
    acls = [acl(dlq, AclOperation.WRITE, AclPermissionType.DENY)]
    if may_describe:
        acls.append(acl(dlq, AclOperation.DESCRIBE, AclPermissionType.ALLOW))
    for future in admin.create_acls(acls).values():
        future.result(timeout=30)
    worker = factory.start("w", bootstrap=bootstrap)
    assert worker.wait(90) == EXIT_CONFIG, worker.log_tail()
    said = "not authorized to write to" if may_describe else "not authorized to use"
    assert f"{said} dead-letter topic '{dlq}'" in worker.log(), worker.log_tail()


def acl(topic: str, operation: Any, permission: Any) -> Any:
    """An ACL binding for the anonymous user (this broker's only principal) on ``topic``."""
    return AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
        operation, permission,
    )  # fmt: skip
