"""Scenarios 20a-20c: a three-broker cluster loses a broker under a running pipeline.

The cluster is what ``kinbox dev --brokers 3`` starts (:func:`dev_stack`,
module-scoped, with its own PostgreSQL): three KRaft nodes, replication
factor 3, ``min.insync.replicas=2``. While two workers apply events (every
k-th one poison, so the dead-letter path runs too) and a relay publishes
outbox rows that a writer keeps committing, one broker is SIGKILLed — the
leader of a partition the workers read (20a), or their group's coordinator
(20b) — and restarted, or every broker is restarted in turn, each after the
last one's replicas caught up (20c, a rolling restart).

Then every event is applied once (the poison ones dead-lettered), the
committed offsets never ran ahead of the database nor moved back, and every
committed outbox row was published, in ``(txid, seq)`` order per key.

Quick mode runs 20a (the cluster and one round cost about a minute); 20b and
20c run in long mode (``--long``), each about as long as 20a, the rolling
restart half as long again.

On the same cluster, not a seeded scenario (it has nothing random to vary), a
broker is SIGSTOPped under the outbox relay while it is the only replica of
one topic: a row for that topic waits for it, and rows of the other keys
must go on being published and marked meanwhile, the later row of the
waiting row's key behind it (:func:`test_a_stopped_topic_holds_up_only_its_own_keys`).
The waiting record's delivery timeout is longer than the test, so "meanwhile"
is an order of events, not a race between the others' publishing and that
timeout.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from kinbox.core.errors import ServiceError
from kinbox.devstack.cluster import KafkaCluster
from kinbox.devstack.command import dev_stack
from kinbox.devstack.stack import Stack
from producer_outbox.writer import enqueue
from tests.conftest import STACK_LINES, cannot_start
from tests.support.database import Conn, drop_schema
from tests.support.fault_run import Run
from tests.support.outbox import (
    RowWriter,
    consume,
    count,
    first_deliveries,
    key_of_every_lane,
    migrate_outbox,
    outbox_rows,
    relay_process,
    running_relay,
    same_lane_key,
    stop_relay,
    wait_all_sent,
)
from tests.support.records import log_ends
from tests.support.scenario import scenario
from tests.support.topics import create_topic, topic_name
from tests.support.waiting import wait_for

POISON_EVERY = 37
KEYS = tuple(f"order-{n}" for n in range(6))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Stack]:
    """``kinbox dev --brokers 3``: three Kafka nodes and a PostgreSQL server of this module's."""
    context = dev_stack(brokers=3)
    try:
        stack = context.__enter__()
    except ServiceError as exc:
        cannot_start("the three-broker cluster (kinbox dev --brokers 3)", exc)
    STACK_LINES.extend(f"(scenarios 20) {line}" for line in stack.describe().splitlines())
    try:
        yield stack
    finally:
        context.__exit__(None, None, None)


@pytest.fixture
def fault_bootstrap(cluster: Stack) -> str:
    """Every round of this module runs on the cluster."""
    return cluster.bootstrap_servers


@pytest.fixture
def fault_database_url(cluster: Stack) -> str:
    """... and on the cluster stack's own PostgreSQL."""
    return cluster.database_url


def nodes(stack: Stack) -> KafkaCluster:
    assert stack.cluster is not None
    return stack.cluster


def _leader_of(stack: Stack, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": stack.bootstrap_servers}).list_topics(timeout=10)
    return int(metadata.topics[topic].partitions[partition].leader)


def _coordinator_of(stack: Stack, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    [future] = admin.describe_consumer_groups([group]).values()
    return int(future.result(timeout=30).coordinator.id)


def _kill_and_restart(run: Run, stack: Stack, node: int, what: str) -> None:
    print(f"[faults] SIGKILL node {node} ({what})")
    nodes(stack).node(node).kill()
    time.sleep(run.rng.uniform(2.0, 6.0))
    nodes(stack).restart(node)
    nodes(stack).wait_in_sync()


def _pipeline(run: Run, stack: Stack, fault: Callable[[], None]) -> None:
    """Workers, the dead-letter path, a relay and a writer run while ``fault`` happens."""
    outbox_topic = create_topic(run.bootstrap, f"{run.topic}-outbox", 3, replication_factor=-1)
    with psycopg.connect(run.database_url, autocommit=True) as db:
        migrate_outbox(db, run.schema)
    produced = run.produce(duplicates=run.rng.randint(0, 10))
    env = {"FAULT_SLEEP": str(run.rng.choice([0.005, 0.01])), "FAULT_POISON_EVERY":
           str(POISON_EVERY)}  # fmt: skip
    writer = RowWriter(run.database_url, run.schema, outbox_topic, KEYS,
                       random.Random(run.rng.random()))  # fmt: skip
    thread = threading.Thread(target=writer.run)
    relay = relay_process(stack, run.schema, "--batch-size", str(run.rng.choice([5, 20])))
    try:
        with run.sampling(monotonic=True):
            # Given two workers, a relay and a writer, all running
            members = [run.factory.start(name, env=env, batch_max_messages=20)
                       for name in ("left", "right")]  # fmt: skip
            thread.start()
            run.wait_handler_calls(run.rng.randint(30, len(produced.records) // 3))
            # When a broker goes (and comes back)
            fault()
            # Then the workers catch up by themselves
            run.wait_caught_up(*members, timeout=120)
            for member in members:
                assert member.stop() == 0, member.log_tail()
        writer.stop.set()
        thread.join(30)
        wait_all_sent(run.database_url, run.schema)
        with psycopg.connect(run.database_url, autocommit=True) as db:
            rows = outbox_rows(db, run.schema)
        assert stop_relay(relay) == 0
    finally:
        writer.stop.set()
        if relay.poll() is None:
            relay.kill()
            relay.wait(10)
    # and the relay published every row, in (txid, seq) order per key
    received = consume(stack, outbox_topic, len(rows), linger=1.0)
    promised: dict[str | None, list[str]] = {}
    for row_id, key, *_ in rows:
        promised.setdefault(key, []).append(row_id)
    firsts = {key: [r.event_id for r in rs] for key, rs in first_deliveries(received).items()}
    assert firsts == promised, "outbox rows lost or out of order per key"
    print(f"[faults] {len(rows)} outbox rows published ({len(received) - len(rows)} twice)")
    run.expect_dead = frozenset(i for i in produced.ids if int(i.rsplit("-", 1)[1]) %
                                POISON_EVERY == 0)  # fmt: skip
    # A dead letter acknowledged just before its batch failed goes out again.
    run.dead_letter_copies = 2
    run.finish(drain_timeout=120)


@scenario("20a", "3 brokers: partition leader killed", fault="leader SIGKILL + restart")
def test_partition_leader_killed_under_the_pipeline(run: Run, cluster: Stack) -> None:
    partition = run.rng.randrange(run.partitions)
    _pipeline(run, cluster, lambda: _kill_and_restart(
        run, cluster, _leader_of(cluster, run.topic, partition), f"leader of {partition}"
    ))  # fmt: skip


@scenario("20b", "3 brokers: group coordinator killed", fault="coordinator SIGKILL + restart",
          long_only=True)  # fmt: skip
def test_group_coordinator_killed_under_the_pipeline(run: Run, cluster: Stack) -> None:
    _pipeline(run, cluster, lambda: _kill_and_restart(
        run, cluster, _coordinator_of(cluster, run.group), "group coordinator"
    ))  # fmt: skip


@scenario("20c", "3 brokers: rolling restart", fault="each broker stopped, restarted",
          long_only=True)  # fmt: skip
def test_rolling_restart_under_the_pipeline(run: Run, cluster: Stack) -> None:
    def roll() -> None:
        order = sorted(nodes(cluster).nodes)
        run.rng.shuffle(order)
        for node in order:
            print(f"[faults] restarting node {node}")
            nodes(cluster).node(node).stop()  # SIGTERM: a controlled shutdown
            nodes(cluster).restart(node)
            nodes(cluster).wait_in_sync()

    _pipeline(run, cluster, roll)


LANES = 8
IN_FLIGHT_FOR = 300_000
"""``message.timeout.ms`` of the relay under a stopped broker: its record waits that long,
past every wait of the test (a row settles only when its record does)."""


def _state(db: Conn, schema: str, row_id: str) -> tuple[Any, ...]:
    """``(status, last_error, sent_at)`` of the outbox row ``row_id``."""
    query = sql.SQL("SELECT status, last_error, sent_at FROM {}.outbox WHERE id = %s")
    row = db.execute(query.format(sql.Identifier(schema)), (row_id,)).fetchone()
    assert row is not None
    return tuple(row)


def test_a_stopped_topic_holds_up_only_its_own_keys(cluster: Stack) -> None:
    kafka = nodes(cluster)
    # Read back through the brokers that stay up: a stopped one never answers.
    up = ",".join(kafka.node(n).bootstrap_servers for n in (1, 2))
    stuck_topic = create_topic(cluster.bootstrap_servers, topic_name("stuck"), replicas=[[3]])
    live = create_topic(cluster.bootstrap_servers, topic_name("live"), replicas=[[1, 2], [2, 1]])
    schema = f"stopped_{topic_name('s').rsplit('-', 1)[1]}"
    key = "stuck-key"
    with psycopg.connect(cluster.database_url, autocommit=True) as db:
        migrate_outbox(db, schema)
        companion = same_lane_key(db, key, LANES)  # its row goes in the stuck row's claim
        kafka_config = {"message.timeout.ms": str(IN_FLIGHT_FOR)}
        try:
            with running_relay(cluster, schema, lanes=LANES, batch_size=50, kafka=kafka_config):
                # Given a relay that published to both topics (node 3 holds the
                # only replica of one, the other lives on nodes 1 and 2), each of
                # its lane groups to the live one: every producer has its producer
                # id and the live topic's metadata before node 3 stops answering
                enqueue(db, stuck_topic, {"warm": True}, key=key, schema=schema)
                enqueue(db, live, {"n": -1}, key=companion, schema=schema)
                warm = key_of_every_lane(db, LANES)
                for n, lane_key in enumerate(warm):
                    enqueue(db, live, {"warm": n}, key=lane_key, schema=schema)
                wait_for(lambda: count(db, schema, "status = 'sent'") == 2 + len(warm),
                         what="warm-up sent")  # fmt: skip
                try:
                    # When node 3 stops, and a row of `key` for its topic is
                    # committed (with a row of another key of the same lane)
                    kafka.node(3).pause()
                    with db.transaction():
                        stuck = str(enqueue(db, stuck_topic, {"stuck": True}, key=key,
                                            schema=schema))  # fmt: skip
                        enqueue(db, live, {"n": 0}, key=companion, schema=schema)
                    # (the companion in Kafka: the claim holding the stuck row went out)
                    wait_for(lambda: sum(log_ends(up, live, 2).values()) == 2 + len(warm),
                             what="the stuck row's claim sent")  # fmt: skip
                    # and rows of other keys follow, and one more of `key`
                    others = []
                    for n in range(1, 21):
                        others.append(str(enqueue(db, live, {"n": n}, key=f"other-{n % 5}",
                                                  schema=schema)))  # fmt: skip
                        time.sleep(0.05)
                    behind = str(enqueue(db, live, {"n": 21}, key=key, schema=schema))
                    listed = ", ".join(f"'{row_id}'" for row_id in others)
                    others_sent = f"status = 'sent' AND id IN ({listed})"

                    # Then every row of the other keys is published and marked
                    # while the stuck row still waits for its broker
                    def flowing() -> bool:
                        status, error, _ = _state(db, schema, stuck)
                        assert (status, error) == ("pending", None), (
                            f"the stuck row settled ({status}, {error}) before the rows of "
                            "other keys were sent: they waited for it"
                        )
                        return count(db, schema, others_sent) == len(others)

                    wait_for(flowing, timeout=60, what="rows of other keys sent")
                    # and the later row of its key waits behind it
                    assert _state(db, schema, behind)[0] == "pending"
                finally:
                    kafka.node(3).resume()
                # When node 3 is back, everything goes out
                wait_all_sent(cluster.database_url, schema, timeout=120)
            kafka.wait_in_sync()
            # Then the stuck row was marked sent before the row behind it was claimed
            assert _state(db, schema, stuck)[2] < _state(db, schema, behind)[2]
            # and every row of the live topic is there, each key's in outbox order
            rows = outbox_rows(db, schema, f"topic = '{live}'")
        finally:
            drop_schema(cluster.database_url, schema)
    received = consume(cluster, live, len(rows), linger=0.5)
    promised: dict[str | None, list[str]] = {}
    for row_id, row_key, *_ in rows:
        promised.setdefault(row_key, []).append(row_id)
    firsts = {k: [r.event_id for r in rs] for k, rs in first_deliveries(received).items()}
    assert firsts == promised
    assert stuck in {r.event_id for r in consume(cluster, stuck_topic, 2, linger=0.5)}
