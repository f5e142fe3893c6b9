"""Rows in flight: a record Kafka has not answered holds back its key, and nothing else.

The relay publishes through :class:`Holding`, a real :class:`KafkaPublisher`
that keeps the records of chosen keys from going out until the test lets
them go: such a record is in flight with no outcome, as one waiting on a
broker that does not answer (the three-broker test with a stopped broker is
in tests/faults/test_cluster_faults.py). Everything else is real: the
broker, PostgreSQL, the relay's lane locks, claims and marks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.publisher import Outcome, OutgoingRecord, Sending
from kinbox.devstack.stack import Stack
from kinbox.kafka.publisher import KafkaPublisher
from producer_outbox.claim import claim
from producer_outbox.lane_locks import lane_key
from producer_outbox.producer import producer_config, relay_publisher
from producer_outbox.relay import Relay
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.integration.test_fatal_producers import relaying
from tests.support.database import Conn
from tests.support.outbox import (
    consume,
    count,
    migrate_outbox,
    relay_config,
    relay_process,
    same_lane_key,
    stop_relay,
)
from tests.support.waiting import wait_for

LANES = 8

Connect = Callable[[], psycopg.Connection[tuple[Any, ...]]]


class Holding:
    """A relay publisher that holds back the records of ``keys`` until :meth:`release`."""

    def __init__(self, inner: KafkaPublisher, keys: set[str]) -> None:
        self.inner = inner
        self.keys = {key.encode() for key in keys}
        self.held: list[tuple[Sending, int, OutgoingRecord]] = []
        # (the inner sending, the relay's, the relay's index of each inner record)
        self._copies: list[tuple[Sending, Sending, list[int]]] = []
        self._lock = threading.Lock()  # the relay's thread sends, the test releases

    def send(self, records: Sequence[OutgoingRecord]) -> Sending:
        outer = Sending(len(records))
        with self._lock:
            going = [i for i, r in enumerate(records) if r.key not in self.keys]
            self.held += [(outer, i, records[i]) for i in range(len(records)) if i not in going]
            if going:
                self._forward(outer, [records[i] for i in going], going)
        return outer

    def serve(self, timeout: float) -> None:
        with self._lock:
            self.inner.serve(timeout)
            for inner, outer, indexes in self._copies:
                for j in inner.known:
                    outcome = inner.outcomes[j]
                    assert outcome is not None
                    outer.settle(indexes[j], outcome)
                inner.known.clear()
            self._copies = [c for c in self._copies if not c[0].done]
            waiting = not self._copies and bool(self.held)
        if waiting:
            time.sleep(timeout)  # nothing comes: a broker that does not answer

    def release(self, outcome: Outcome | None = None) -> None:
        """Let the held records go; with ``outcome``, report that instead of sending them."""
        with self._lock:
            held, self.held, self.keys = self.held, [], set()
            for outer, index, record in held:
                if outcome is None:
                    self._forward(outer, [record], [index])
                else:
                    outer.settle(index, outcome)

    def close(self) -> None:
        self.inner.close()

    def _forward(self, outer: Sending, records: list[OutgoingRecord], indexes: list[int]) -> None:
        self._copies.append((self.inner.send(records), outer, indexes))


def _state(db: Conn, schema: str, row_id: object) -> tuple[Any, ...]:
    """``(status, attempts, last_error, sent_at)`` of one outbox row."""
    query = sql.SQL("SELECT status, attempts, last_error, sent_at FROM {}.outbox WHERE id = %s")
    row = db.execute(query.format(sql.Identifier(schema)), (row_id,)).fetchone()
    assert row is not None
    return tuple(row)


@contextmanager
def _relay(
    stack: Stack, schema: str, keys: set[str], connect: Connect | None = None, **config: Any
) -> Iterator[Holding]:
    """A relay (in a thread) publishing through a :class:`Holding` of ``keys``."""
    publisher = Holding(relay_publisher(producer_config(stack.bootstrap_servers, {})), keys)
    relay = Relay(relay_config(stack, schema, lanes=LANES, **config), publisher, connect=connect)
    try:
        with relaying(relay):
            try:
                yield publisher
            finally:
                publisher.release()  # a relay stops once its rows in flight settled
    finally:
        publisher.close()


def test_a_row_in_flight_holds_back_its_key_and_nothing_else(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic(partitions=1)
    neighbour = same_lane_key(db, "k", LANES)  # claimed with k's rows, one lane
    with _relay(stack, schema, {"k"}) as publisher:
        # Given a row of k in flight that Kafka does not answer
        first = enqueue(db, topic, {"n": 0}, key="k", schema=schema)
        wait_for(lambda: bool(publisher.held), what="k's row sent")
        # When rows of other keys (one of them in k's lane) and a later row
        # of k are committed
        others = [
            enqueue(db, topic, {"n": n}, key=key, schema=schema)
            for n, key in enumerate([neighbour, "a", neighbour, "b"], start=1)
        ]
        later = enqueue(db, topic, {"n": 5}, key="k", schema=schema)
        # Then the other keys' rows are published and marked, k's wait
        wait_for(
            lambda: all(_state(db, schema, row_id)[0] == "sent" for row_id in others),
            what="rows of other keys sent",
        )
        assert _state(db, schema, first)[:3] == ("pending", 0, None)
        assert _state(db, schema, later)[:3] == ("pending", 0, None)
        assert len(publisher.held) == 1, "k's later row was claimed behind the one in flight"
        # When Kafka answers, k's rows go out in order
        publisher.release()
        wait_for(lambda: count(db, schema, "status = 'sent'") == 6, what="all sent")
    assert _state(db, schema, first)[3] < _state(db, schema, later)[3]
    received = consume(stack, topic, 6, linger=0.5)
    assert [r.event_id for r in received if r.key == "k"] == [str(first), str(later)]


def test_a_failure_reported_after_the_connection_died_is_not_marked(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # A relay that lost its connection lost its lane locks with it: another
    # relay may own the row now, so a failure it learns of later is not its
    # to record. With max_attempts=1, recording it would park the row.
    migrate_outbox(db, schema)
    topic = make_topic(partitions=1)
    name = f"relay-{schema}"

    def connect() -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(stack.database_url, autocommit=True, application_name=name)

    def backends() -> int:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        row = db.execute(query, (name,)).fetchone()
        return int(row[0]) if row else 0

    with _relay(stack, schema, {"k"}, connect, max_attempts=1, backoff_base=0.1) as publisher:
        # Given a row in flight
        row_id = enqueue(db, topic, {"n": 0}, key="k", schema=schema)
        wait_for(lambda: bool(publisher.held), what="the row sent")
        # When the relay's connections die (its lane locks with them), and it
        # connects again
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        )
        wait_for(lambda: backends() == 0, what="the relay's backends gone")
        wait_for(lambda: backends() == 2, what="the relay connected again")
        # and only then learns that the record was refused
        publisher.release(Outcome("MSG_SIZE_TOO_LARGE: refused"))
        # Then the failure is not recorded: the row is claimed again and sent
        wait_for(lambda: _state(db, schema, row_id)[0] != "pending", what="the row settled")
    assert _state(db, schema, row_id)[:3] == ("sent", 1, None)
    assert [r.event_id for r in consume(stack, topic, 1, linger=0.5)] == [str(row_id)]


def test_a_lane_with_a_row_in_flight_stays_with_its_relay_when_another_joins(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic(partitions=1)
    # A key of the highest lane: the first a relay gives up when another joins
    row = db.execute(
        "SELECT 'k' || n FROM generate_series(1, 1000) AS n"
        " WHERE (hashtext('k' || n) & 2147483647) %% %s = %s LIMIT 1",
        (LANES, LANES - 1),
    ).fetchone()
    assert row is not None
    key = str(row[0])
    with _relay(stack, schema, {key}) as publisher:
        # Given a row of that lane in flight in the first relay
        row_id = enqueue(db, topic, {"n": 0}, key=key, schema=schema)
        wait_for(lambda: bool(publisher.held), what="the row sent")
        # When a second relay joins and takes its share of the lanes (half:
        # the first keeps 4, the second's two lane groups take 2 each)
        second = relay_process(stack, schema, "--lanes", str(LANES))
        try:
            wait_for(lambda: sorted(_lane_holders(db, schema)) == [2, 2, 4], timeout=30,
                     what="the lanes shared out")  # fmt: skip
            # Then the lane in flight stayed with the first: the second claims
            # none of its rows (a row of another key of that lane goes out, the
            # one in flight does not)
            other = enqueue(db, topic, {"n": 1}, key=same_lane_key(db, key, LANES), schema=schema)
            wait_for(lambda: _state(db, schema, other)[0] == "sent", what="the neighbour sent")
            assert _state(db, schema, row_id)[0] == "pending"
            # and the row goes out once Kafka answers
            publisher.release()
            wait_for(lambda: _state(db, schema, row_id)[0] == "sent", what="the row sent")
        finally:
            assert stop_relay(second) == 0
    received = consume(stack, topic, 2, linger=1.0)
    assert [r.event_id for r in received].count(str(row_id)) == 1


def _lane_holders(db: Conn, schema: str) -> list[int]:
    """How many lanes of ``schema`` each backend holds (the lanes' advisory locks)."""
    rows = db.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND objsubid = 2 AND classid = (%s::bigint & 4294967295)::oid GROUP BY pid",
        (lane_key(schema),),
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_the_claim_leaves_out_the_keys_and_keyless_rows_in_flight_and_writes_nothing(
    schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    ids = {
        name: str(enqueue(db, "t", {"n": name}, key=key, schema=schema))
        for name, key in [("k1a", "k1"), ("k2", "k2"), ("x", None), ("k1b", "k1"), ("y", None)]
    }
    everything = range(LANES)
    rows = claim(db, schema, owned=everything, lanes=LANES, limit=10)
    assert [r.id for r in rows] == list(ids.values())
    assert {r.lane for r in rows} <= set(everything)
    # With k1 and the keyless row x in flight, neither comes again
    rows = claim(
        db, schema, owned=everything, lanes=LANES, limit=10, busy_keys={"k1"}, busy_ids={ids["x"]}
    )
    assert [r.id for r in rows] == [ids["k2"], ids["y"]]
    # and no claim left a transaction open holding their locks: another one
    # may lock every row at once
    with psycopg.connect(db.info.dsn, autocommit=False) as other:
        query = sql.SQL("SELECT id FROM {}.outbox FOR UPDATE NOWAIT").format(sql.Identifier(schema))
        assert len(other.execute(query).fetchall()) == 5
