"""A revoke served inside a poll, on the real client: nothing lost, nothing skipped.

A poll makes two ``consume()`` calls and librdkafka serves rebalance
callbacks inside each. The failpoint ``poll_between_consumes`` holds the
first member between the two, right after the first call returned a record
of a partition whose earlier records are all applied and committed; a second
member joins meanwhile, and the group's rebalance takes that partition away
from the first (cooperatively, eagerly — everything, then the rest back — or
by the broker's KIP-848 assignment). Released, the first member's second call
serves the revoke: the offset it commits must stay below the record the first
call returned, and the second member must apply that record.

A member that closes is revoked inside a poll too: it leaves the group in
its polls before the client's ``close()`` (see :mod:`kinbox.kafka.consumer`),
under every protocol.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from kinbox import App
from kinbox.core import failpoints
from kinbox.core.config import Settings
from kinbox.devstack.stack import Stack
from kinbox.kafka import KafkaTransport
from tests.conftest import MakeTopic
from tests.integration.inbox_app import recorder
from tests.integration.inbox_support import (
    assert_offsets_not_ahead,
    committed,
    effects,
    produce,
    running,
)
from tests.support.database import Conn, prepare_schema
from tests.support.launch import FAST_GROUP, FAST_TIMINGS
from tests.support.waiting import wait_for

POINT = "poll_between_consumes"
FIRST, SECOND = "z-first", "a-second"
"""The members' client ids (and effect rows): the joiner's sorts first."""


def member_app(group: str, schema: str, name: str, *topics: str) -> App:
    """An app on ``topics`` whose effect rows say which member applied them (``consumer``)."""
    app = App(group_id=group, schema=schema)
    record = recorder(schema, name)
    for topic in topics:
        app.handler(topic)(record)
    return app


def _owners(admin: AdminClient, group: str, target: bool = False) -> dict[str, set[str]]:
    """The group's state and, per member (by client id), the topics it owns (or is to own)."""
    description = admin.describe_consumer_groups([group])[group].result(10)
    owners: dict[str, set[str]] = {"state": {str(description.state)}}
    for member in description.members:
        assignment = member.target_assignment if target else member.assignment
        owners[member.client_id] = {
            tp.topic for tp in (assignment.topic_partitions if assignment else [])
        }
    return owners


def cooperative_revoke_sent(admin: AdminClient, group: str, moving: str) -> bool:
    """The first round ended: both members in, the moving partition nobody's (being revoked)."""
    owners = _owners(admin, group)
    return (
        owners.pop("state") == {str(ConsumerGroupState.STABLE)}
        and len(owners) == 2
        and not any(moving in topics for topics in owners.values())
    )


def eager_revoke_sent(admin: AdminClient, group: str, moving: str) -> bool:
    """The second member joined: the group waits for the first to give everything back."""
    return _owners(admin, group)["state"] == {str(ConsumerGroupState.PREPARING_REBALANCING)}


def target_without(admin: AdminClient, group: str, moving: str) -> bool:
    """KIP-848: the broker's target assignment takes the moving partition from the first member."""
    owners = _owners(admin, group, target=True)
    return FIRST in owners and moving not in owners[FIRST] and SECOND in owners


PROTOCOLS: dict[str, tuple[dict[str, str], Callable[[AdminClient, str, str], bool]]] = {
    "cooperative-sticky": ({**FAST_GROUP}, cooperative_revoke_sent),
    "eager": ({**FAST_GROUP, "partition.assignment.strategy": "range"}, eager_revoke_sent),
    "kip848": ({"group.protocol": "consumer"}, target_without),
}
"""Each protocol's ``-X`` properties, and how the broker shows the revoke is decided."""


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_revoke_inside_a_poll_loses_nothing(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, protocol: str
) -> None:
    moving, staying = make_topic(partitions=1), make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    kafka, revoke_sent = PROTOCOLS[protocol]

    def config(client_id: str) -> Settings:
        return Settings(
            bootstrap_servers=stack.bootstrap_servers, database_url=stack.database_url,
            group_id=group, schema=schema, kafka_overrides={**kafka, "client.id": client_id},
            **FAST_TIMINGS,
        ).validate()  # fmt: skip

    first = member_app(group, schema, FIRST, moving, staying)
    # The joiner takes only the moving topic, so the assignment moves exactly
    # that partition to it (the range assignor too: its client id sorts first).
    second = member_app(group, schema, SECOND, moving)
    produced = produce(stack.bootstrap_servers, moving, [(f"e{i}", 0) for i in range(3)])
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    with running(first, config(FIRST)):
        # Given a member that applied and committed everything of the partition so far
        wait_for(
            lambda: committed(stack.bootstrap_servers, group, moving, 1) == {0: 3},
            timeout=60, what="the first member applying and committing e0..e2",
        )  # fmt: skip
        # and is held between a poll's two calls, its first call having returned e3
        failpoints.configure(f"{POINT}=pause")
        try:
            produce(stack.bootstrap_servers, moving, [("e3", 0), ("e4", 0)], produced)
            wait_for(lambda: failpoints.held(POINT), timeout=60, what="the poll held")
            # When a second member joins, and the rebalance takes the partition away
            with running(second, config(SECOND)):
                wait_for(
                    lambda: revoke_sent(admin, group, moving),
                    timeout=60, what="the rebalance revoking the partition",
                )  # fmt: skip
                # The broker decided: give the held member's client (its
                # heartbeats go on) a moment to hear it, then let it go on.
                time.sleep(2)
                failpoints.configure(None)
                # Then the second member applies the partition's remaining events
                wait_for(
                    lambda: committed(stack.bootstrap_servers, group, moving, 1) == {0: 5},
                    timeout=60, what="the partition's offsets committed to its end",
                )  # fmt: skip
        finally:
            failpoints.configure(None)  # a failed wait too: the member must stop

    rows = effects(db, schema)
    by_member = {row[1]: [r[0] for r in rows if r[1] == row[1]] for row in rows}
    # The revoke landed inside the held poll: the first member never applied
    # e3, the record that poll's first call had returned (else the story
    # did not happen, whatever the outcome)
    assert FIRST not in by_member.get("e3", []), f"e3 applied by the first member: {rows}"
    # and every event was applied exactly once: e3 by the member that got its partition
    assert by_member == {
        "e0": [FIRST], "e1": [FIRST], "e2": [FIRST], "e3": [SECOND], "e4": [SECOND],
    }, rows  # fmt: skip
    assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, moving, 1, produced)


class _Closing:
    """A rebalance listener noting which Python call into the client served each revoke."""

    def __init__(self) -> None:
        self.owned: set[tuple[str, int]] = set()
        self.revoked_in: list[str] = []

    def on_assigned(self, partitions: list[tuple[str, int]]) -> None:
        self.owned.update(partitions)

    def on_revoked(self, partitions: list[tuple[str, int]]) -> None:
        self.owned.difference_update(partitions)
        # The caller of the transport's callback is the method whose call into
        # the client served it: the poll's consume(), or the client's close().
        self.revoked_in.append(sys._getframe(2).f_code.co_name)

    def on_lost(self, partitions: list[tuple[str, int]]) -> None:
        self.owned.difference_update(partitions)

    def on_committed(self, offsets: object, error: object) -> None:
        pass


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_a_closing_member_is_revoked_inside_a_poll_never_inside_the_clients_close(
    stack: Stack, make_topic: MakeTopic, protocol: str
) -> None:
    # Given a member that owns a topic's partitions
    topic = make_topic(partitions=2)
    settings = Settings(
        bootstrap_servers=stack.bootstrap_servers, database_url="postgresql:///unused",
        group_id=f"g-{uuid.uuid4().hex[:8]}", kafka_overrides=PROTOCOLS[protocol][0],
        **FAST_TIMINGS,
    ).validate()  # fmt: skip
    transport, listener = KafkaTransport(settings), _Closing()
    transport.subscribe([topic], listener)
    wait_for(lambda: transport.poll(10, 0.2) == [] and len(listener.owned) == 2, timeout=60,
             what="the member owning both partitions")  # fmt: skip
    # When it closes
    transport.close()
    # Then its partitions were revoked inside a poll of its own: the client's
    # close() had nothing left to revoke (a revoke served there can hang)
    assert listener.revoked_in == ["_consume"] and not listener.owned, listener.revoked_in
