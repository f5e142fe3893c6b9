"""A handler that swallows a database error gets a failed try, never an outage (real broker, DB).

Every way to swallow a refused statement (:mod:`tests.integration.swallow_support`),
in every handler shape, runs on a topic of its own under one real worker:
three good events and two whose handler swallows an error. For each case the
rows tell the story: every good event applied once, every bad one
dead-lettered after ``max_attempts`` with its ``processed_events`` row saying
why, and the partition's committed offset past all of them. A database error
a handler caught must never make its partition wait as for an outage.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from kinbox.app import App
from kinbox.devstack.stack import Stack
from tests.integration.failure_support import running
from tests.integration.inbox_support import settings
from tests.integration.orm_support import on_path
from tests.integration.swallow_support import (
    BAD,
    ROLES,
    Case,
    Statements,
    cases,
    checked_table,
    ids,
    register,
)
from tests.integration.typed_support import produce_values
from tests.support.database import drop_schema, prepare_schema
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

CASES = cases()
MAX_ATTEMPTS = 2


@dataclass(frozen=True)
class Outcome:
    """What the worker left behind, for every case at once."""

    topics: dict[str, str]
    effects: Counter[str]
    statuses: dict[str, tuple[str, str | None]]
    committed: dict[str, int]


def _committed(bootstrap: str, group: str, topics: list[str]) -> dict[str, int]:
    """The committed offset of partition 0 of each of ``topics`` (absent: left out)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        parts = consumer.committed([TopicPartition(t, 0) for t in topics], timeout=20)
    finally:
        consumer.close()
    return {tp.topic: tp.offset for tp in parts if tp.offset >= 0}


@pytest.fixture(scope="module")
def outcome(stack: Stack) -> Iterator[Outcome]:
    """Run every case under one worker until each event has a verdict (or time runs out)."""
    schema = f"kb_{uuid.uuid4().hex[:12]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    statements = Statements.of(schema)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(checked_table(schema))
    app = App(group_id=group, schema=schema)
    topics: dict[str, str] = {}
    for case in CASES:
        topic = create_topic(stack.bootstrap_servers, partitions=1, prefix="swallow")
        topics[case.name] = topic
        register(app, case, topic, group, statements, max_attempts=MAX_ATTEMPTS)
        produce_values(stack.bootstrap_servers, topic, [(i, b"{}") for i in ids(case)])
    # The breaker stays closed: so many poison events at once would open it,
    # and this is about each event's verdict, not about pausing the member.
    config = settings(
        stack.bootstrap_servers, on_path(stack.database_url, schema), group, schema,
        max_attempts=MAX_ATTEMPTS, breaker_failures=0,
    )  # fmt: skip
    expected = len(CASES) * len(ROLES)
    names = list(topics.values())
    query = sql.SQL("SELECT event_id, status, reason FROM {}.processed_events").format(
        sql.Identifier(schema)
    )
    try:
        with psycopg.connect(stack.database_url, autocommit=True) as db, running(app, config):

            def verdicts() -> int:
                return len(db.execute(query).fetchall())

            # A case that stalls shows in its own test below, not here.
            try:
                wait_for(lambda: verdicts() >= expected, 120, "a verdict for every event")
                wait_for(
                    lambda: (
                        set(_committed(stack.bootstrap_servers, group, names).values())
                        == {len(ROLES)}
                    ),
                    30,
                    "every offset committed",
                )
            except AssertionError:
                pass
        with psycopg.connect(stack.database_url, autocommit=True) as db:
            rows = db.execute(query).fetchall()
            effect_rows = db.execute(
                sql.SQL("SELECT event_id FROM {}.effects").format(sql.Identifier(schema))
            ).fetchall()
        yield Outcome(
            topics,
            Counter(r[0] for r in effect_rows),
            {r[0]: (r[1], r[2]) for r in rows},
            _committed(stack.bootstrap_servers, group, names),
        )
    finally:
        drop_schema(stack.database_url, schema)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_swallowed_database_error_is_a_failed_try_of_its_event(
    outcome: Outcome, case: Case
) -> None:
    events = ids(case)
    good = [e for e in events if e.rpartition("/")[2] not in BAD]
    bad = [e for e in events if e.rpartition("/")[2] in BAD]
    # Every good event applied once, with its row saying so
    assert {e: outcome.effects[e] for e in good} == dict.fromkeys(good, 1)
    assert {e: outcome.statuses.get(e, ("missing", None))[0] for e in good} == dict.fromkeys(
        good, "applied"
    )
    # Every bad event dead-lettered, its effect rolled back, its row saying why
    assert {e: outcome.effects[e] for e in bad} == dict.fromkeys(bad, 0)
    for event_id in bad:
        status, reason = outcome.statuses.get(event_id, ("missing", None))
        assert status == "dead_lettered", (event_id, status)
        assert (reason or "").startswith("handler-error"), (event_id, reason)
    # And the partition moved past all of them
    assert outcome.committed.get(outcome.topics[case.name]) == len(ROLES)
