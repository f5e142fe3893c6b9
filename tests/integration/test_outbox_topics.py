"""A topic Kafka refuses as a whole is an outage of that topic, never a failure of its rows.

The shared test broker creates topics on first use and enforces no ACLs, so
this module starts a broker of its own with ``auto.create.topics.enable=false``
and an authorizer (that lets everyone do anything on a resource without ACLs).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from psycopg import sql

from kinbox.core.errors import ServiceError
from kinbox.devstack.kafka import KafkaBroker
from kinbox.devstack.stack import Stack
from producer_outbox.writer import enqueue
from tests.conftest import cannot_start
from tests.support.database import Conn
from tests.support.outbox import (
    consume,
    count,
    migrate_outbox,
    outbox_command,
    outbox_rows,
    running_relay,
)
from tests.support.topics import create_topic
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def strict_broker() -> Iterator[KafkaBroker]:
    """A broker that never creates a topic on first use, and enforces ACLs."""
    broker = KafkaBroker(
        settings={
            "auto.create.topics.enable": "false",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "true",
        }
    )
    try:
        broker.start()
    except ServiceError as exc:
        broker.close()
        cannot_start("a Kafka broker with auto-create off and an authorizer", exc)
    yield broker
    broker.close()


def _create(broker: KafkaBroker, name: str) -> None:
    create_topic(broker.bootstrap_servers, name, partitions=2)


def _failures(db: Conn, schema: str, topic: str) -> int:
    row = db.execute(
        sql.SQL("SELECT failures FROM {}.outbox_failing_topics WHERE topic = %s").format(
            sql.Identifier(schema)
        ),
        (topic,),
    ).fetchone()
    return int(row[0]) if row else 0


def test_missing_topic_never_parks_its_rows_shows_in_status_and_recovers(
    stack: Stack, strict_broker: KafkaBroker, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    missing, present = f"missing-{uuid.uuid4().hex[:8]}", f"present-{uuid.uuid4().hex[:8]}"
    _create(strict_broker, present)
    # Given a row for a topic that does not exist, a later row of its key for a
    # topic that does, and a row of another key
    lost = str(enqueue(db, missing, {"n": 1}, key="k", schema=schema))
    behind = str(enqueue(db, present, {"n": 2}, key="k", schema=schema))
    other = str(enqueue(db, present, {"n": 3}, key="o", schema=schema))
    kafka = {"topic.metadata.propagation.max.ms": "1000", "message.timeout.ms": "10000"}
    # max_attempts=1: a single counted failure would park a row at once
    with running_relay(
        stack,
        schema,
        bootstrap_servers=strict_broker.bootstrap_servers,
        kafka=kafka,
        max_attempts=1,
        backoff_base=0.2,
        backoff_max=1.0,
    ):
        # When the relay has met the missing topic in several rounds
        wait_for(lambda: _failures(db, schema, missing) >= 3, what="3 rounds on the topic")
        wait_for(lambda: count(db, schema, f"id = '{other}' AND status = 'sent'") == 1)
        # Then its row is untouched: pending, no attempt, never parked; the
        # key's row in the working topic waits behind it; other keys flow
        rows = {r[0]: r[2:] for r in outbox_rows(db, schema)}
        assert rows[lost] == ("pending", 0, None)
        assert rows[behind] == ("pending", 0, None)
        assert count(db, schema, "status = 'dead'") == 0
        # and the status names the topic and the error
        shown = outbox_command(stack, schema, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        (failing,) = json.loads(shown.stdout)["failing_topics"]
        assert failing["topic"] == missing and failing["pending"] == 1
        assert "UNKNOWN_TOPIC" in failing["error"] and failing["failures"] >= 3
        text = outbox_command(stack, schema, "status").stdout
        assert f"topic={missing}" in text and "UNKNOWN_TOPIC" in text

        # When the topic is created
        _create(strict_broker, missing)
        wait_for(lambda: count(db, schema, "status = 'sent'") == 3, timeout=60, what="all sent")
    # Then the row went out and the topic is no longer failing
    assert _failures(db, schema, missing) == 0
    assert (
        json.loads(outbox_command(stack, schema, "status", "--json").stdout)["failing_topics"] == []
    )
    received = consume(stack, missing, 1, bootstrap_servers=strict_broker.bootstrap_servers)
    assert [r.event_id for r in received] == [lost]


def test_a_topic_the_relay_may_not_write_never_parks_its_rows_and_recovers(
    stack: Stack, strict_broker: KafkaBroker, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    denied, present = f"denied-{uuid.uuid4().hex[:8]}", f"present-{uuid.uuid4().hex[:8]}"
    _create(strict_broker, denied)
    _create(strict_broker, present)
    # Given a topic the relay may see but not write (the anonymous user's only
    # principal here), a row for it, a later row of its key elsewhere, another key
    admin = AdminClient({"bootstrap.servers": strict_broker.bootstrap_servers})
    acls = [
        _acl(denied, AclOperation.DESCRIBE, AclPermissionType.ALLOW),
        _acl(denied, AclOperation.WRITE, AclPermissionType.DENY),
    ]
    for future in admin.create_acls(acls).values():
        future.result(timeout=30)
    refused = str(enqueue(db, denied, {"n": 1}, key="k", schema=schema))
    behind = str(enqueue(db, present, {"n": 2}, key="k", schema=schema))
    other = str(enqueue(db, present, {"n": 3}, key="o", schema=schema))
    with running_relay(
        stack,
        schema,
        bootstrap_servers=strict_broker.bootstrap_servers,
        kafka={"message.timeout.ms": "10000"},
        max_attempts=1,  # a single counted failure would park a row at once
        backoff_base=0.2,
        backoff_max=1.0,
    ):
        # When the relay has been refused in several rounds
        wait_for(lambda: _failures(db, schema, denied) >= 3, what="3 rounds on the topic")
        wait_for(lambda: count(db, schema, f"id = '{other}' AND status = 'sent'") == 1)
        # Then its row is untouched and never parked, the key's later row waits,
        # the other key flowed, and the status names the topic and the refusal
        rows = {r[0]: r[2:] for r in outbox_rows(db, schema)}
        assert rows[refused] == ("pending", 0, None)
        assert rows[behind] == ("pending", 0, None)
        assert count(db, schema, "status = 'dead'") == 0
        (failing,) = json.loads(outbox_command(stack, schema, "status", "--json").stdout)[
            "failing_topics"
        ]
        assert failing["topic"] == denied and failing["pending"] == 1
        assert "AUTHORIZATION_FAILED" in failing["error"], failing
        # When the operator lifts the refusal
        gone = AclBindingFilter(
            ResourceType.TOPIC, denied, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*",
            AclOperation.ANY, AclPermissionType.ANY,
        )  # fmt: skip
        for future in admin.delete_acls([gone]).values():
            future.result(timeout=30)
        wait_for(lambda: count(db, schema, "status = 'sent'") == 3, timeout=60, what="all sent")
    # Then the row went out, in its key's order, and the topic is no longer failing
    assert _failures(db, schema, denied) == 0
    received = consume(stack, denied, 1, bootstrap_servers=strict_broker.bootstrap_servers)
    assert [r.event_id for r in received] == [refused]


def _acl(topic: str, operation: Any, permission: Any) -> Any:
    """An ACL for the anonymous user (this broker's only principal) on ``topic``."""
    pattern = ResourcePatternType.LITERAL
    return AclBinding(
        ResourceType.TOPIC, topic, pattern, "User:ANONYMOUS", "*", operation, permission
    )
