"""One trace from the business transaction to the handler's statement, on the real stack.

The in-process tests give the SDK's in-memory exporter to the relay, the
worker and the handler explicitly (no global provider: other tests of the
session stay untraced). The process test gives a real ``kinbox worker``
nothing but the ``OTEL_*`` environment.
"""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.telemetry import RelayTelemetry
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.integration.inbox_support import effects, running, settings, worker_env
from tests.integration.traced_app import STATEMENT_SPAN, make_app
from tests.support.database import Conn, prepare_schema
from tests.support.launch import ROOT, worker_argv
from tests.support.outbox import migrate_outbox, running_relay
from tests.support.records import write_records
from tests.support.waiting import wait_for

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK tracer provider of the test's own, exporting to memory."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider, spans
    provider.shutdown()


def hex_id(span: ReadableSpan) -> str:
    return f"{span.context.span_id:016x}"


def parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def only(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in spans]}"
    return found[0]


def test_one_trace_runs_from_the_business_transaction_through_the_relay_to_the_handler(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: Conn,
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, spans = exported
    prepare_schema(stack.database_url, schema)
    migrate_outbox(db, schema)
    topic, group = make_topic(), f"traced-{uuid.uuid4().hex[:8]}"
    # Given a business transaction, in a span of its own, that enqueues an event
    with (
        provider.get_tracer("shop").start_as_current_span("CompleteLesson"),
        psycopg.connect(stack.database_url) as conn,
        conn.transaction(),
    ):
        conn.execute("SELECT 1")  # the business write would be here
        event_id = str(enqueue(conn, topic, {"lesson": 7}, key="u1", schema=schema))
    # ... and an untraced one
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        untraced = str(enqueue(conn, topic, {"lesson": 8}, key="u2", schema=schema))
    stored: dict[str, Any] = {
        str(row[0]): row[1]
        for row in db.execute(
            sql.SQL("SELECT id::text, traceparent FROM {}.outbox").format(sql.Identifier(schema))
        )
    }
    # ... the row stored the business span's context; the untraced one none
    assert stored[untraced] is None and stored[event_id].startswith("00-")
    # When the relay publishes them and a worker applies them, its handler
    # tracing its own statement
    app = make_app(topic, schema, group, tracer_provider=provider)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with (
        running_relay(stack, schema, telemetry=RelayTelemetry(schema, provider)),
        running(app, config),
    ):
        wait_for(lambda: len(effects(db, schema, group)) == 2, what="both events applied")
    finished = list(spans.get_finished_spans())
    business = only(finished, "CompleteLesson")
    send = only(finished, f"send {topic}")
    processed = [s for s in finished if s.name == f"process {topic}"]
    traced = only(
        [s for s in processed if s.context.trace_id == business.context.trace_id],
        f"process {topic}",
    )
    statement = next(
        s for s in finished if s.name == STATEMENT_SPAN and parent_id(s) == hex_id(traced)
    )
    # Then one trace: business transaction -> the relay's send -> the handler
    # -> the handler's own statement, each the parent of the next
    assert {s.context.trace_id for s in (business, send, traced, statement)} == {
        business.context.trace_id
    }
    assert business.parent is None
    assert parent_id(send) == hex_id(business) and send.kind is trace.SpanKind.PRODUCER
    assert parent_id(traced) == hex_id(send) and traced.kind is trace.SpanKind.CONSUMER
    assert (traced.attributes or {})["messaging.message.id"] == event_id
    assert (traced.attributes or {})["messaging.consumer.group.name"] == group
    # ... the worker's batch span is in the worker's own trace, linked from the handler's
    batch = next(
        s for s in finished if s.name == "kinbox.batch" and any(
            link.context.span_id == s.context.span_id for link in traced.links
        )
    )  # fmt: skip
    assert batch.context.trace_id != business.context.trace_id
    # ... the untraced event got no send span and starts no producer trace
    [other] = [s for s in processed if s is not traced]
    assert (other.attributes or {})["messaging.message.id"] == untraced
    assert parent_id(other) is not None and other.links == ()  # a child of its batch span
    assert [s.name for s in finished].count(f"send {topic}") == 1


def test_link_mode_keeps_the_handler_in_the_workers_trace(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: Conn,
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, spans = exported
    prepare_schema(stack.database_url, schema)
    topic, group = make_topic(), f"linked-{uuid.uuid4().hex[:8]}"
    write_records(
        stack.bootstrap_servers,
        topic,
        [(0, [("event-id", b"e1"), ("traceparent", TRACEPARENT.encode())], "e1")],
    )
    app = make_app(topic, schema, group, tracer_provider=provider)
    config = settings(
        stack.bootstrap_servers, stack.database_url, group, schema, trace_context="link"
    )
    with running(app, config):
        wait_for(lambda: len(effects(db, schema, group)) == 1, what="the event applied")
    finished = list(spans.get_finished_spans())
    processed = only(finished, f"process {topic}")
    batch = only(finished, "kinbox.batch")
    assert parent_id(processed) == hex_id(batch)
    assert [f"{link.context.trace_id:032x}" for link in processed.links] == [
        TRACEPARENT.split("-")[1]
    ]


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the SDK's console exporter wrote: JSON objects one after another."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    index = 0
    while True:
        start = text.find("{", index)
        if start < 0:
            return found
        value, index = decoder.raw_decode(text, start)
        if isinstance(value, dict) and "context" in value:
            found.append(value)


def test_a_worker_process_exports_spans_given_only_the_otel_environment(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, tmp_path: Path
) -> None:
    prepare_schema(stack.database_url, schema)
    topic, group = make_topic(), f"console-{uuid.uuid4().hex[:8]}"
    # Given records from a traced producer
    write_records(
        stack.bootstrap_servers,
        topic,
        [
            (0, [("event-id", b"e1"), ("traceparent", TRACEPARENT.encode())], "e1"),
            (1, [("event-id", b"e2")], "e2"),
        ],
    )
    # When `kinbox worker` runs with the console exporter named in its environment
    stdout = tmp_path / "stdout"
    env = worker_env(
        stack.bootstrap_servers, stack.database_url, topic, group, schema,
        OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="lessons",
    )  # fmt: skip
    with stdout.open("wb") as out:
        worker = subprocess.Popen(
            worker_argv("tests.integration.traced_app:app"), cwd=ROOT, env=env, stdout=out
        )
        try:
            wait_for(lambda: len(effects(db, schema, group)) == 2, what="both events applied")
            # a graceful stop flushes the spans still batched
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
    # Then it printed its spans: the traced event's handler continues the
    # producer's trace, and the handler's statement is its child
    spans = console_spans(stdout.read_text())
    processed = {
        s["attributes"]["messaging.message.id"]: s for s in spans if s["name"] == f"process {topic}"
    }
    assert set(processed) == {"e1", "e2"}
    e1 = processed["e1"]
    assert e1["context"]["trace_id"] == "0x" + TRACEPARENT.split("-")[1]
    assert e1["parent_id"] == "0x" + TRACEPARENT.split("-")[2]
    assert e1["kind"] == "SpanKind.CONSUMER"
    assert e1["resource"]["attributes"]["service.name"] == "lessons"
    statements = [s for s in spans if s["name"] == STATEMENT_SPAN]
    assert {s["parent_id"] for s in statements} == {
        s["context"]["span_id"] for s in processed.values()
    }
    assert {s["name"] for s in spans} >= {"kinbox.batch", "kinbox.claim", "kinbox.commit"}
