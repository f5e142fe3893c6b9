"""A relay's lane groups publish side by side, never share a key, and a failure holds its key.

Two lane groups of one relay each run one batch at a time on their own
connection and producer; both have batches in flight at once. Per-key order
rests on a key never being in two groups' batches: checked here by recording,
per publish call, which group's publisher sent which keys, while one key's
row is refused by the broker and parks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from psycopg import sql

from kinbox.core.publisher import OutgoingRecord, Sending
from kinbox.devstack.stack import Stack
from kinbox.kafka.publisher import KafkaPublisher
from producer_outbox.producer import producer_config, relay_publisher
from producer_outbox.relay import Relay
from producer_outbox.writer import enqueue
from tests.integration.test_fatal_producers import relaying
from tests.integration.test_outbox_parked import _topic_with_limit
from tests.support.database import Conn
from tests.support.outbox import (
    consume,
    count,
    migrate_outbox,
    outbox_rows,
    relay_config,
)
from tests.support.waiting import wait_for

LIMIT = 1000  # the topic's max.message.bytes


@dataclass
class PublishLog:
    """What every group's publisher sent, shared by the siblings."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    senders: dict[bytes, set[int]] = field(default_factory=dict)
    """Key -> the publishers (groups) that sent a record of it."""
    active: int = 0
    most_active: int = 0


class RecordingPublisher:
    """A KafkaPublisher that logs which group sent which keys, and when publishes overlap.

    The relay asks the first group's publisher for a sibling per other group
    when it starts; a sibling asked for later is a group's second producer,
    for the rows that go alone, and publishes for that group.
    """

    def __init__(
        self, inner: KafkaPublisher, log: PublishLog, number: int = 0, groups: int = 2
    ) -> None:
        self.inner, self.log, self.number, self.groups = inner, log, number, groups
        self.siblings: list[RecordingPublisher] = []

    def send(self, records: Sequence[OutgoingRecord]) -> Sending:
        """Publish ``records`` and wait for their outcomes: sent one batch at a time."""
        with self.log.lock:
            for record in records:
                if record.key is not None:
                    self.log.senders.setdefault(record.key, set()).add(self.number)
            self.log.active += 1
            self.log.most_active = max(self.log.most_active, self.log.active)
        try:
            time.sleep(0.01)  # widen each publish, so the groups' publishes surely overlap
            return Sending.of(self.inner.publish(records))
        finally:
            with self.log.lock:
                self.log.active -= 1

    def sibling(self) -> RecordingPublisher:
        another_group = self.number == 0 and len(self.siblings) < self.groups - 1
        number = 1 + len(self.siblings) if another_group else self.number
        sibling = RecordingPublisher(self.inner.sibling(), self.log, number, self.groups)
        self.siblings.append(sibling)
        return sibling

    def serve(self, timeout: float) -> None:
        """Nothing is ever left in flight."""

    def close(self) -> None:
        self.inner.close()


def test_lane_groups_overlap_never_share_a_key_and_a_refused_row_holds_only_its_key(
    stack: Stack, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    _admin, topic = _topic_with_limit(stack, LIMIT)
    keys = [f"key-{n}" for n in range(40)]

    # Given a backlog over many keys, with one row of key "big" over the topic's
    # size limit early on and more rows of "big" behind it
    def put(n: int, key: str, payload: object = None) -> str:
        return str(enqueue(db, topic, payload or {"n": n}, key=key, schema=schema))

    with db.transaction(), db.pipeline():
        for n in range(1200):
            put(n, keys[n % len(keys)])
            if n == 50:
                put(n, "big")
            elif n == 100:
                bad = put(n, "big", b"x" * (5 * LIMIT))
            elif n in (300, 600):
                put(n, "big")
    log = PublishLog()
    # One record a produce batch: the topic's 1,000-byte limit applies to a
    # whole record batch, so a batch of a dozen small rows, or the big row's
    # batch-mates, would be refused too, and a later row of their key acked in
    # another request would overtake them (the limitation the relay documents:
    # keep -X message.max.bytes within the topics' limits). This test is about
    # what the refused row itself holds back.
    kafka = relay_publisher(producer_config(stack.bootstrap_servers, {"batch.num.messages": "1"}))
    publisher = RecordingPublisher(kafka, log)
    try:
        # When one relay with two lane groups publishes it
        config = relay_config(
            stack, schema, parallel=2, lanes=8, batch_size=40,
            max_attempts=2, backoff_base=0.2, backoff_max=0.2,
        )  # fmt: skip
        relay = Relay(config, publisher)
        assert relay.groups == 2
        with relaying(relay):
            wait_for(lambda: count(db, schema, "status = 'sent'") == 1200 + 1, timeout=90,
                     what="every row but the refused one and those behind it sent")  # fmt: skip
            wait_for(lambda: count(db, schema, f"id = '{bad}' AND status = 'dead'") == 1)
    finally:
        publisher.close()
    # Then both groups had publishes in flight at once, and no key was ever
    # sent by more than one group
    assert log.most_active == 2
    assert {number for senders in log.senders.values() for number in senders} == {0, 1}
    shared = {key: senders for key, senders in log.senders.items() if len(senders) > 1}
    assert not shared, f"keys sent by two lane groups: {shared}"
    # and the refused row parked, holding back only the rows of its key behind it
    rows = outbox_rows(db, schema, "aggregateid = 'big'")
    assert [(r[0] == bad, r[2]) for r in rows] == [
        (False, "sent"), (True, "dead"), (False, "pending"), (False, "pending")
    ]  # fmt: skip
    received = consume(stack, topic, 1201, linger=1.0)
    assert [r.key for r in received].count("big") == 1
    # and every key's first deliveries came in the outbox's (txid, seq) order
    promised: dict[str | None, list[str]] = {}
    query = sql.SQL("SELECT id::text, aggregateid FROM {}.outbox WHERE status = 'sent'"
                    " ORDER BY txid, seq").format(sql.Identifier(schema))  # fmt: skip
    for event_id, key in db.execute(query):
        promised.setdefault(key, []).append(event_id)
    firsts: dict[str | None, list[str]] = {}
    seen: set[str] = set()
    for record in sorted(received, key=lambda r: (r.partition, r.offset)):
        if record.event_id not in seen:
            seen.add(record.event_id)
            firsts.setdefault(record.key, []).append(record.event_id)
    assert firsts == promised
