"""The CDC path on the real stack: outbox → PostgreSQL WAL → Debezium (Kafka Connect) → inbox.

One Kafka Connect worker (distributed mode, Debezium's PostgreSQL connector)
runs for the whole module; each test registers a connector with its own
replication slot and removes both afterwards. The worker is a real JVM that the
tests SIGKILL and stop; PostgreSQL is restarted in immediate mode.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg import sql

from examples.lessons.app import TOPIC, app, complete_lesson, create_tables
from kinbox.cli.outbox import RET_WARNING, outbox
from kinbox.core.errors import PayloadError
from kinbox.devstack.connect import KafkaConnect
from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.stack import Stack
from kinbox.store.migrations import migrate
from kinbox.store.schema import INBOX
from producer_outbox import enqueue
from producer_outbox.cleanup import delete_older
from producer_outbox.schema import OUTBOX
from tests.conftest import REPORT_LINES, MakeTopic
from tests.integration.cdc_support import (
    FAST_CONNECTOR,
    outbox_connector,
    search_path_url,
    write_wal,
)
from tests.integration.inbox_support import effects, running, settings
from tests.integration.traced_app import STATEMENT_SPAN
from tests.integration.traced_app import make_app as traced_app
from tests.support.database import prepare_schema
from tests.support.outbox import Received, consume, count
from tests.support.waiting import wait_for

Conn = psycopg.Connection[tuple[Any, ...]]


def lessons_schema(db: Conn, stack: Stack, schema: str) -> str:
    """Migrate inbox + outbox into ``schema`` and create the example's tables there."""
    migrate(db, schema, [INBOX, OUTBOX])
    url = search_path_url(stack.database_url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        create_tables(conn)
    return url


@contextmanager
def lessons_worker(stack: Stack, url: str, schema: str) -> Iterator[str]:
    """Run the example's worker (unique group), reading the event id from ``event-id`` only."""
    group = f"progress-{uuid.uuid4().hex[:8]}"
    config = settings(stack.bootstrap_servers, url, group, schema, id_headers=("event-id",))
    with running(app, config):
        yield group


def applications(db: Conn, schema: str, ids: list[str]) -> tuple[int, int]:
    """``(handler applications, distinct events applied)`` among ``ids``."""
    row = db.execute(
        sql.SQL(
            "SELECT count(*), count(DISTINCT event_id) FROM {}.lesson_applications"
            " WHERE event_id = ANY(%s)"
        ).format(sql.Identifier(schema)),
        (ids,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def deliveries(stack: Stack, ids: list[str], *, minimum: int) -> list[Received]:
    """The records of ``lesson-events`` carrying one of ``ids`` (the topic is shared)."""
    wanted = set(ids)
    records = consume(stack, TOPIC, minimum, timeout=60, keep=lambda r: r.event_id in wanted)
    assert len(records) >= minimum, f"{len(records)} of {minimum} records found in {TOPIC}"
    return records


def test_complete_lesson_through_debezium_is_applied_once_in_key_order(
    stack: Stack, connect: KafkaConnect, schema: str, db: Conn, make_topic: MakeTopic
) -> None:
    url = lessons_schema(db, stack, schema)
    tag = uuid.uuid4().hex[:6]
    users = [f"cdc-{tag}-{n}" for n in range(3)]
    side_topic = make_topic(prefix="cdc-headers")
    with outbox_connector(connect, stack.database_url, schema), psycopg.connect(url) as conn:
        # Given CompleteLesson committed 8 times per user, and rolled back 8 times
        ids_by_user: dict[str, list[str]] = defaultdict(list)
        ghosts = [f"ghost-{tag}-{n}" for n in range(8)]
        for lesson in range(8):
            for user in users:
                ids_by_user[user].append(
                    str(complete_lesson(conn, user, f"l{lesson}", schema=schema))
                )
            with pytest.raises(RuntimeError), conn.transaction():
                complete_lesson(conn, ghosts[lesson], f"l{lesson}", schema=schema)
                raise RuntimeError("payment declined")
        # ... and an event with headers of its own, on another topic
        with conn.transaction():
            side_id = enqueue(
                conn,
                side_topic,
                {"n": None, "mixed": [1, "a"]},
                key="k",
                headers={"tenant": "acme", "x-trace": "abc"},
                event_type="lesson.audit",
                schema=schema,
            )
        ids = [i for user in users for i in ids_by_user[user]]

        # When Debezium publishes and a kinbox worker (id from `event-id` only) consumes
        with lessons_worker(stack, url, schema):
            wait_for(lambda: applications(db, schema, ids)[1] == len(ids), 90, "24 applications")

        # Then each committed completion was applied once, none of the rolled-back ones
        assert applications(db, schema, ids) == (24, 24)
        ghost_rows = db.execute(
            sql.SQL("SELECT count(*) FROM {}.lesson_progress WHERE user_id = ANY(%s)").format(
                sql.Identifier(schema)
            ),
            (ghosts,),
        ).fetchone()
        assert ghost_rows == (0,)
        records = deliveries(stack, ids, minimum=24)
        assert not [r for r in records if r.key in ghosts]
        # ... each user's events came in commit order, on one partition
        for user in users:
            mine = sorted((r for r in records if r.key == user), key=lambda r: r.offset)
            assert len({r.partition for r in mine}) == 1
            assert [r.event_id for r in mine] == ids_by_user[user]
            assert all(r.headers["id"] == r.headers["event-id"] for r in mine)
        # ... and the side event: one header per stored header, the payload's JSON as is
        [side] = consume(stack, side_topic, 1)
        assert side.event_id == str(side_id) and side.key == "k"
        assert side.value == b'{"n": null, "mixed": [1, "a"]}'
        assert side.headers["tenant"] == b"acme" and side.headers["x-trace"] == b"abc"
        assert side.headers["ce_type"] == b"lesson.audit"
        assert "kinbox.headers" not in side.headers

        # A bytes payload is refused in the business transaction, not lost downstream
        with pytest.raises(PayloadError, match="CDC"), conn.transaction():
            enqueue(conn, side_topic, b"\x00raw", schema=schema)

        # CDC cleanup deletes by age whatever the status, and the deletes publish nothing
        rows = count(db, schema)
        assert rows == 24 + 1 and count(db, schema, "status = 'sent'") == 0
        assert delete_older(db, schema, retention=timedelta(0), batch=10) == rows
        with conn.transaction():
            marker = enqueue(conn, side_topic, {"marker": True}, schema=schema)
        after = consume(stack, side_topic, 2)
        assert [r.event_id for r in after] == [str(side_id), str(marker)]


def test_the_trace_context_columns_become_headers_by_default_and_null_adds_none(
    stack: Stack, connect: KafkaConnect, schema: str, db: Conn, make_topic: MakeTopic
) -> None:
    # Given an outbox migrated with its trace-context columns (no DEFAULT: the writer fills them)
    migrate(db, schema, [OUTBOX])
    insert = sql.SQL(
        "INSERT INTO {} (id, topic, aggregatetype, aggregateid, payload, traceparent, tracestate)"
        " VALUES (%s, %s, %s, 'k', '{{}}', %s, %s)"
    ).format(sql.Identifier(schema, "outbox"))
    topic = make_topic()
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced, untraced = uuid.uuid4(), uuid.uuid4()
    # ... and the connector registered as a user would (no --header-column)
    with (
        outbox_connector(connect, stack.database_url, schema),
        psycopg.connect(stack.database_url) as conn,
    ):
        with conn.transaction():
            conn.execute(insert, (traced, topic, topic, traceparent, "vendor=1"))
            conn.execute(insert, (untraced, topic, topic, None, None))
        records = {r.event_id: r for r in consume(stack, topic, 2)}
    # Then the columns' values are the record's headers, and a NULL adds no header
    assert records[str(traced)].headers["traceparent"] == traceparent.encode()
    assert records[str(traced)].headers["tracestate"] == b"vendor=1"
    assert "traceparent" not in records[str(untraced)].headers
    assert "tracestate" not in records[str(untraced)].headers
    assert records[str(untraced)].headers["event-id"] == str(untraced).encode()


def test_one_trace_runs_from_the_business_transaction_through_debezium_to_the_handler(
    stack: Stack, connect: KafkaConnect, schema: str, db: Conn, make_topic: MakeTopic
) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    prepare_schema(stack.database_url, schema)
    migrate(db, schema, [OUTBOX])
    topic, group = make_topic(), f"cdc-traced-{uuid.uuid4().hex[:8]}"
    with outbox_connector(connect, stack.database_url, schema):
        # Given a business transaction, in a span, that enqueues an event
        with (
            provider.get_tracer("shop").start_as_current_span("CompleteLesson") as business,
            psycopg.connect(stack.database_url) as conn,
            conn.transaction(),
        ):
            event_id = str(enqueue(conn, topic, {"lesson": 1}, key="u1", schema=schema))
        # When Debezium publishes it (the default connector config) and a worker applies it
        app = traced_app(topic, schema, group, tracer_provider=provider)
        config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
        with running(app, config):
            wait_for(lambda: len(effects(db, schema, group)) == 1, 90, "the event applied")
    # Then the handler's span is the business span's child, in its trace, and
    # the handler's statement the handler span's child
    finished = list(spans.get_finished_spans())
    [processed] = [s for s in finished if s.name == f"process {topic}"]
    [statement] = [s for s in finished if s.name == STATEMENT_SPAN]
    context = business.get_span_context()
    assert processed.context.trace_id == context.trace_id
    assert processed.parent is not None and processed.parent.span_id == context.span_id
    assert (processed.attributes or {})["messaging.message.id"] == event_id
    assert statement.parent is not None
    assert statement.parent.span_id == processed.context.span_id


def test_connect_sigkilled_mid_stream_duplicates_are_suppressed(
    stack: Stack, connect: KafkaConnect, schema: str, db: Conn
) -> None:
    url = lessons_schema(db, stack, schema)
    tag = uuid.uuid4().hex[:6]
    ids: list[str] = []
    with outbox_connector(connect, stack.database_url, schema) as cdc:
        with lessons_worker(stack, url, schema):
            stop = threading.Event()

            def write() -> None:
                with psycopg.connect(url) as conn:
                    n = 0
                    while not stop.is_set() or n < 400:
                        ids.append(
                            str(complete_lesson(conn, f"k-{tag}-{n % 7}", f"l{n}", schema=schema))
                        )
                        n += 1
                        time.sleep(0.002)

            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            # Given Debezium publishing while CompleteLesson keeps committing
            wait_for(lambda: applications(db, schema, ids)[1] >= 150, 60, "150 applications")
            # When the Connect worker is SIGKILLed mid-stream and started again
            connect.kill()
            time.sleep(1.0)  # the writer goes on while the worker is down
            connect.start()
            stop.set()
            writer.join(60)
            assert not writer.is_alive()
            cdc.wait_running()
            wait_for(lambda: applications(db, schema, ids)[1] == len(ids), 120, "every application")
        # Then every event took effect exactly once ...
        applied, distinct = applications(db, schema, ids)
        assert applied == distinct == len(ids)
        # ... although Debezium re-sent what followed its last committed offset
        records = deliveries(stack, ids, minimum=len(ids))
        per_id = Counter(r.event_id for r in records)
        assert set(per_id) == set(ids)
        duplicates = len(records) - len(ids)
        REPORT_LINES.append(
            f"CDC, Connect SIGKILLed mid-stream: {len(ids)} events, {len(records)} deliveries, "
            f"{duplicates} duplicates suppressed by the inbox, {applied} applications"
        )
        assert duplicates > 0, "the restart re-sent nothing: the kill missed the stream"


def test_postgres_restarted_immediately_under_the_connector_loses_nothing(
    own_postgres: PostgresServer, stack: Stack, connect: KafkaConnect, make_topic: MakeTopic
) -> None:
    schema = f"kb_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(own_postgres.url, autocommit=True) as conn:
        migrate(conn, schema, [OUTBOX])
    topic = make_topic()
    failures: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        # Enqueue with a fresh connection after each failure: the restart kills
        # sessions; what committed is whatever the outbox holds afterwards.
        n = 0
        while not stop.is_set():
            try:
                with psycopg.connect(own_postgres.url, connect_timeout=2) as conn:
                    while not stop.is_set():
                        with conn.transaction():
                            enqueue(conn, topic, {"n": n}, key=f"k{n % 5}", schema=schema)
                        n += 1
                        time.sleep(0.003)
            except Exception as exc:  # the server went away (StoreError, OperationalError)
                if stop.is_set():
                    break
                failures.append(exc)
                time.sleep(0.2)

    with outbox_connector(connect, own_postgres.url, schema, extra=FAST_CONNECTOR) as cdc:
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        with psycopg.connect(own_postgres.url, autocommit=True) as conn:
            wait_for(lambda: count(conn, schema) >= 200, 30, "200 committed rows")
        # When PostgreSQL restarts in immediate mode (crash recovery) under the connector
        own_postgres.restart(immediate=True)
        with psycopg.connect(own_postgres.url, autocommit=True) as conn:
            before = count(conn, schema)
            wait_for(lambda: count(conn, schema) >= before + 200, 60, "200 rows after restart")
        stop.set()
        writer.join(30)
        cdc.wait_running()
        with psycopg.connect(own_postgres.url, autocommit=True) as conn:
            committed = {
                str(row[0])
                for row in conn.execute(
                    sql.SQL("SELECT id FROM {}.outbox").format(sql.Identifier(schema))
                )
            }
        # Then every committed row was published, and nothing else
        records = consume(stack, topic, len(committed), timeout=120)
        assert {r.event_id for r in records} == committed
        assert failures, "the writer never saw the restart"
        REPORT_LINES.append(
            f"CDC, PostgreSQL restarted immediately: {len(committed)} committed rows, "
            f"{len(records)} deliveries, none lost"
        )


def test_slot_retains_wal_while_connect_is_down_and_status_warns(
    stack: Stack, connect: KafkaConnect, schema: str, db: Conn, make_topic: MakeTopic
) -> None:
    migrate(db, schema, [OUTBOX])
    topic = make_topic()
    with outbox_connector(connect, stack.database_url, schema) as cdc:
        # Given a connector whose worker is stopped
        connect.stop()
        wait_for(lambda: cdc.slot_row()[0] is False, 30, "the slot to go inactive")
        retained_before = int(cdc.slot_row()[1])
        # When the database keeps writing
        with psycopg.connect(stack.database_url) as conn, conn.transaction():
            for n in range(50):
                enqueue(conn, topic, {"n": n}, key=f"k{n % 3}", schema=schema)
        write_wal(db, schema, megabytes=4)
        # Then the slot holds the WAL back, and status says so (exit 5)
        retained = int(cdc.slot_row()[1])
        assert retained >= retained_before + 3 * 1024 * 1024
        threshold = retained_before + 1024 * 1024
        result = CliRunner().invoke(
            outbox,
            ["status", "--json", "--slot-warn-bytes", str(threshold)],
            env={"KINBOX_DATABASE_URL": stack.database_url, "KINBOX_SCHEMA": schema},
        )
        assert result.exit_code == RET_WARNING, result.output
        assert cdc.slot in result.output and "INACTIVE" in result.output
        table = CliRunner().invoke(
            outbox,
            ["status", "--slot-warn-bytes", str(threshold)],
            env={"KINBOX_DATABASE_URL": stack.database_url, "KINBOX_SCHEMA": schema},
        )
        assert table.exit_code == RET_WARNING, table.output
        assert f"WARNING: replication slot {cdc.slot!r} holds back" in table.output
        # ... and nothing written meanwhile is lost once the worker is back
        connect.start()
        cdc.wait_running()
        assert len({r.event_id for r in consume(stack, topic, 50)}) == 50
        REPORT_LINES.append(
            f"CDC, Connect down: slot {cdc.slot} retained {retained_before} → {retained} bytes "
            f"of WAL; status warned past {threshold}"
        )


def test_heartbeat_moves_the_slot_on_a_quiet_outbox(
    stack: Stack, connect: KafkaConnect, schema: str, db: Conn
) -> None:
    migrate(db, schema, [OUTBOX])
    with outbox_connector(connect, stack.database_url, schema, heartbeat_ms=500) as cdc:
        # The connector's publication holds the outbox table alone, so the
        # server decodes nothing else for its slot (the scratch table below included)
        published = db.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (cdc.slot,),
        ).fetchall()
        assert published == [(schema, "outbox")]
        # Given nothing written to the outbox, but WAL written elsewhere
        write_wal(db, schema, megabytes=2)
        target = cdc.slot_row()[3]

        def confirmed_past_target() -> bool:
            row = db.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (target, cdc.slot),
            ).fetchone()
            return row == (True,)

        # Then the heartbeat's message gives the connector a position to confirm
        wait_for(confirmed_past_target, 60, "the slot to confirm past the unrelated writes")
