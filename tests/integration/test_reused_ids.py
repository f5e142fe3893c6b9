"""Reused event ids on the real stack: not applied, counted, logged, and shown by `kinbox explain`.

A worker (real broker, real PostgreSQL) with a sync or an async handler,
per event or per batch, meets an id again: with the same payload (a plain
duplicate: silent) and with another one (a reuse: reported with both
positions). And a schema migrated before payload digests were kept: its old
rows never report.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kinbox.app import App
from kinbox.core.event import Event
from kinbox.core.outcome import BatchResult
from kinbox.core.record import Record
from kinbox.core.reuse import Sighting
from kinbox.core.steps import CheckReused, Claim, Seen, Steps
from kinbox.devstack.stack import Stack
from kinbox.middleware.base import Middleware
from kinbox.store.awaiting import MixedInboxStore
from kinbox.store.migrations import Component
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from kinbox.store.statements import InboxStatements
from tests.conftest import MakeTopic
from tests.integration.inbox_support import effects, settings
from tests.integration.ops_support import ROOT
from tests.integration.refusal_support import payload, run_to_end, with_id, write
from tests.support.database import Conn, prepare_schema

KINDS = ["sync-each", "sync-batch", "async-each", "async-batch"]


class Counted(Middleware):
    """Sums what the batch results say: what the worker's metrics count."""

    def __init__(self) -> None:
        self.duplicates = self.reused = 0

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None = None,
    ) -> None:
        self.duplicates += result.duplicates
        self.reused += result.reused


def effect_app(kind: str, topic: str, schema: str, group: str, counted: Counted) -> App:
    """A handler of ``kind`` writing one effect row per event, its payload's ``n`` as its pid."""
    app = App(group_id=group, schema=schema)
    app.add_middleware(counted)
    insert = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(schema))

    def row(event: Event) -> tuple[Any, ...]:
        return (group, event.id, event.topic, event.partition, event.offset, event.json()["n"])

    batch = kind.endswith("batch")
    if kind == "sync-each":

        @app.handler(topic)
        def each(event: Event, tx: Any) -> None:
            tx.execute(insert, row(event))

    elif kind == "sync-batch":

        @app.handler(topic, batch=True)
        def many(events: list[Event], tx: Any) -> None:
            for event in events:
                tx.execute(insert, row(event))

    elif not batch:

        @app.handler(topic)
        async def each_async(event: Event, tx: Any) -> None:
            await tx.execute(insert, row(event))

    else:

        @app.handler(topic, batch=True)
        async def many_async(events: list[Event], tx: Any) -> None:
            for event in events:
                await tx.execute(insert, row(event))

    return app


def explained(stack: Stack, schema: str, event_id: str) -> dict[str, Any]:
    shown = subprocess.run(
        [sys.executable, "-m", "kinbox", "explain", event_id, "--json",
         "--database-url", stack.database_url, "--schema", schema],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    found: dict[str, Any] = json.loads(shown.stdout)
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_a_reused_id_is_not_applied_and_is_counted_logged_and_explained(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: Conn,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    counted = Counted()
    app = effect_app(kind, topic, schema, group, counted)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    # Given a and b applied
    first = write(
        stack.bootstrap_servers, topic, [(with_id("a"), payload(n=1)), (with_id("b"), payload(n=1))]
    )
    run_to_end(app, config, first)

    # When a comes again as it was, b with another payload, and c is new
    again = write(
        stack.bootstrap_servers, topic,
        [(with_id("a"), payload(n=1)), (with_id("b"), payload(n=2)), (with_id("c"), payload(n=1))],
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="kinbox"):
        run_to_end(app, config, again)

    # Then nothing is applied twice: b keeps its first payload's effect
    assert sorted((r[1], r[4]) for r in effects(db, schema)) == [("a", 1), ("b", 1), ("c", 1)]
    # b is counted and logged, with both positions; a is a silent duplicate
    assert (counted.duplicates, counted.reused) == (2, 1)
    b_first, b_again = first.places[1][1], again.places[1][1]
    warned = [r.getMessage() for r in caplog.records if "reused" in r.getMessage()]
    assert len(warned) == 1, warned
    assert all(
        part in warned[0]
        for part in ("'b'", repr(group), f"{topic}[0]@{b_first}", f"{topic}[0]@{b_again}")
    ), warned
    # and kinbox explain shows the sighting for b, none for a
    shown = explained(stack, schema, "b")
    [sighting] = shown["reused"]
    assert (sighting["consumer"], sighting["topic"], sighting["offset"]) == (group, topic, b_again)
    assert (sighting["first_topic"], sighting["first_offset"]) == (topic, b_first)
    assert explained(stack, schema, "a")["reused"] == []


def test_rows_claimed_before_digests_were_kept_never_report(stack: Stack, schema: str) -> None:
    # Given an inbox at version 3, with a row claimed then (no digest)
    before = Component("inbox", INBOX.steps[:3])
    apply_migrations(stack.database_url, schema, [before])
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset")'
                " VALUES ('g', 'old', 't', 0, 0)"
            ).format(sql.Identifier(schema))
        )
    # When it is migrated to this version
    assert apply_migrations(stack.database_url, schema, [INBOX])["inbox"] == (3, INBOX.version)
    with psycopg.connect(stack.database_url) as conn:
        hashes = conn.execute(
            sql.SQL("SELECT payload_hash FROM {}.processed_events").format(sql.Identifier(schema))
        ).fetchall()
    assert hashes == [(None,)]  # the old row is left as it was

    # Then a duplicate of the old row never reports; one of a new row does
    def program(_tx: Seen) -> Steps[list[Sighting]]:
        events = [
            Event("old", "t", 0, 5, None, b"anything"),
            Event("new", "t", 0, 6, None, b"1"),
            Event("new", "t", 0, 7, None, b"2"),
        ]
        fresh: list[Event] = yield Claim(events)
        found: list[Sighting] = yield CheckReused([e for e in events if e not in fresh])
        return found

    store = MixedInboxStore(stack.database_url, schema=schema, consumer="g")
    store.open()
    try:
        found = store.run(program)
        found_async = store.for_async().run(program)
    finally:
        store.close()
    assert [(s.event.id, s.event.offset, s.first_offset) for s in found] == [("new", 7, 6)]
    assert found_async == []  # the same records again: recorded once


@pytest.mark.parametrize("built_beforehand", [False, True], ids=["by-migrate", "concurrently"])
def test_the_primary_key_carries_the_digest_so_a_look_up_reads_the_index_alone(
    stack: Stack, schema: str, built_beforehand: bool
) -> None:
    # Given an inbox at version 5 holding a claimed row with its digest
    before = Component("inbox", INBOX.steps[:5])
    apply_migrations(stack.database_url, schema, [before])
    table = sql.Identifier(schema)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset",'
                " payload_hash) VALUES ('g', 'a', 't', 0, 0, 7)"
            ).format(table)
        )
        if built_beforehand:  # as docs/operations.md tells a team with a large table
            statement = (ROOT / "docs_src/operations/covering_key.sql").read_text()
            conn.execute(statement.replace(" kinbox.", f" {table.as_string(conn)}.").encode())
    # When it is migrated to this version
    assert apply_migrations(stack.database_url, schema, [INBOX])["inbox"] == (5, INBOX.version)
    with psycopg.connect(stack.database_url) as conn:
        # Then the primary key is the one index over the ids, carrying the digest
        indexes = conn.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
            " WHERE indrelid = %s::regclass AND indisunique",
            (f"{table.as_string(conn)}.processed_events",),
        ).fetchall()
        shapes = [(name.rsplit(".", 1)[-1], define.split(" USING ")[1]) for name, define in indexes]
        assert shapes == [
            ("processed_events_pkey", "btree (consumer, event_id) INCLUDE (payload_hash)")
        ]
        # the row kept, still a duplicate for a claim
        assert conn.execute(
            sql.SQL("SELECT event_id, payload_hash FROM {}.processed_events").format(table)
        ).fetchall() == [("a", 7)]
        # and the skim's look-up is planned as an index-only scan of it
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = conn.execute(
            b"EXPLAIN " + InboxStatements.of(schema).known,
            {"consumer": "g", "ids": "{a}", "hashes": (7).to_bytes(8, "big")},
        ).fetchall()
        assert any("Index Only Scan using processed_events_pkey" in line for (line,) in plan), plan
