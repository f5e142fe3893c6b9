"""Metrics on the real stack: a worker's and a relay's Prometheus endpoints, the relay's gauges."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.telemetry import RelayTelemetry
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.integration.inbox_support import effects, produce, worker_env
from tests.support.database import Conn, prepare_schema
from tests.support.launch import ROOT, worker_argv
from tests.support.outbox import count, migrate_outbox, relay_process, running_relay, stop_relay
from tests.support.records import set_max_message_bytes
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> Samples:
    """Every sample of the endpoint, by name and labels (OpenTelemetry's scope labels left out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if not k.startswith("otel_scope")}
            samples[(sample.name, frozenset(labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples whose labels include ``labels``; None if there is none."""
    found = [v for (n, have), v in samples.items() if n == name and set(labels.items()) <= have]
    return sum(found) if found else None


def scrapes(port: int) -> Samples:
    """One scrape; an endpoint not up yet reads as no samples."""
    try:
        return scrape(port)
    except OSError:
        return {}


@contextmanager
def worker_process(env: dict[str, str], *options: str) -> Iterator[subprocess.Popen[bytes]]:
    worker = subprocess.Popen(
        worker_argv("tests.integration.inbox_app:app", options), cwd=ROOT, env=env
    )
    try:
        yield worker
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                raise


def test_a_worker_serves_what_it_processed_and_its_lag_to_prometheus(
    stack: Stack, schema: str, db: Conn
) -> None:
    prepare_schema(stack.database_url, schema)
    topic = create_topic(stack.bootstrap_servers, partitions=1, prefix="metrics")
    group, port = f"metrics-{uuid.uuid4().hex[:8]}", free_port()
    env = worker_env(
        stack.bootstrap_servers, stack.database_url, topic, group, schema,
        INBOX_TEST_SLEEP="0.3",  # a slow handler: the lag is seen while it works
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
    )  # fmt: skip
    # Given a worker with a metrics port (librdkafka reporting every 200 ms)
    with worker_process(env, "--metrics-port", str(port), "-X", "statistics.interval.ms=200"):
        # ... that has applied and committed a first event
        produce(stack.bootstrap_servers, topic, [("first", 0)])
        wait_for(lambda: len(effects(db, schema, group)) == 1, what="the first event applied")
        wait_for(
            lambda: value(scrapes(port), "kinbox_consumer_lag", topic=topic) == 0,
            what="lag 0 after the first commit",
        )
        # When 6 more records come, 2 of them repeating an id (a producer's retries)
        produce(
            stack.bootstrap_servers,
            topic,
            [(f"e{n}", 0) for n in range(4)] + [("e0", 0), ("e1", 0)],
        )
        lags: list[float] = []

        def drained() -> bool:
            samples = scrapes(port)
            lag = value(samples, "kinbox_consumer_lag", topic=topic, group=group, partition="0")
            if lag is not None:
                lags.append(lag)
            return value(samples, "kinbox_events_applied_total", topic=topic) == 5 and lag == 0

        wait_for(drained, what="5 applied and lag 0 on the endpoint", interval=0.1)
        final = scrape(port)
    # Then the lag rose while the handler worked and fell to 0 once committed,
    # and the endpoint counted what the database shows
    assert max(lags) > 0, lags
    assert len(effects(db, schema, group)) == 5
    assert value(final, "kinbox_events_duplicate_total", topic=topic) == 2


def test_the_worker_endpoint_counts_match_what_was_processed(
    stack: Stack, schema: str, db: Conn
) -> None:
    prepare_schema(stack.database_url, schema)
    topic = create_topic(stack.bootstrap_servers, partitions=2, prefix="metrics")
    group, port = f"metrics-{uuid.uuid4().hex[:8]}", free_port()
    env = worker_env(
        stack.bootstrap_servers, stack.database_url, topic, group, schema,
        KINBOX_METRICS_PORT=str(port),  # the environment's way
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
    )  # fmt: skip
    # Given 7 records: 5 events, 2 of them delivered twice
    produce(
        stack.bootstrap_servers,
        topic,
        [("a", 0), ("b", 1), ("c", 0), ("d", 1), ("e", 0), ("a", 0), ("d", 1)],
    )
    # When a worker with a metrics port applies them
    with worker_process(env):
        wait_for(lambda: len(effects(db, schema, group)) == 5, what="5 events applied")
        wait_for(
            lambda: value(scrapes(port), "kinbox_events_duplicate_total", topic=topic) == 2,
            what="2 duplicates counted",
        )
        samples = scrape(port)
    # Then its endpoint counts what the database shows
    assert value(samples, "kinbox_events_applied_total", topic=topic) == 5
    assert value(samples, "kinbox_events_received_total", topic=topic) == 7
    consumed = "messaging_client_consumed_messages_total"
    assert value(samples, consumed, messaging_destination_name=topic) == 7
    processed = value(
        samples,
        "messaging_process_duration_seconds_count",
        messaging_destination_name=topic,
        messaging_consumer_group_name=group,
    )
    assert processed == 5
    assert value(samples, "kinbox_claim_duration_seconds_count", topic=topic) is not None
    assert value(samples, "kinbox_commit_duration_seconds_count", topic=topic) is not None
    assert value(samples, "kinbox_batch_size_sum", topic=topic) == 7
    assert value(samples, "target_info", service_name="kinbox-worker") == 1


def test_the_relay_reports_its_backlog_parked_rows_and_publish_failures(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    fine, small = make_topic(), make_topic()
    set_max_message_bytes(stack.bootstrap_servers, small, 1024)
    reader = InMemoryMetricReader()
    telemetry = RelayTelemetry(schema, meter_provider=MeterProvider(metric_readers=[reader]))
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        for n in range(3):
            enqueue(conn, fine, {"n": n}, key=f"k{n}", schema=schema)
        enqueue(conn, small, {"pad": "x" * 4000}, key="big", schema=schema)
        parked = enqueue(conn, fine, {"n": "parked"}, key="p", schema=schema)
    db.execute(
        sql.SQL("UPDATE {}.outbox SET status = 'dead' WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        (parked,),
    )

    def points(name: str) -> dict[frozenset[tuple[str, Any]], float]:
        data = reader.get_metrics_data()
        return {
            frozenset(dict(point.attributes or {}).items()): getattr(point, "value", 0.0)
            for rm in (data.resource_metrics if data is not None else ())
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == name
            for point in metric.data.data_points
        }

    def gauge(name: str) -> float | None:
        return points(name).get(frozenset({("schema", schema)}))

    with running_relay(stack, schema, telemetry=telemetry, metrics_interval=0.2, max_attempts=100):
        wait_for(lambda: count(db, schema, "status = 'sent'") == 3, what="3 rows sent")
        wait_for(lambda: gauge("kinbox.outbox.retrying") == 1, what="the big row retrying")
    # The gauges are the outbox as the database has it: one row left pending
    # (retrying, too large for its topic), one parked
    assert count(db, schema, "status = 'pending'") == 1
    assert gauge("kinbox.outbox.pending") == 1
    assert gauge("kinbox.outbox.parked") == 1
    oldest = gauge("kinbox.outbox.oldest_pending.age")
    assert oldest is not None and oldest > 0
    # ... and every try was counted, the failures by topic and kind
    sent = points("messaging.client.sent.messages")
    ok = frozenset(
        {("messaging.system", "kafka"), ("messaging.operation.name", "send"),
         ("messaging.destination.name", fine)}
    )  # fmt: skip
    assert sent[ok] == 3
    failures = points("kinbox.outbox.publish.failures")
    assert failures[frozenset({("topic", small), ("kind", "row")})] >= 1
    refused = [labels for labels in sent if ("error.type", "MSG_SIZE_TOO_LARGE") in labels]
    assert refused and all(("messaging.destination.name", small) in r for r in refused)


def test_a_relay_process_serves_its_metrics_to_prometheus(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic, port = make_topic(), free_port()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        for n in range(2):
            enqueue(conn, topic, {"n": n}, key=f"k{n}", schema=schema)
    relay = relay_process(
        stack, schema, "--metrics-port", str(port),
        env={"OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1"},
    )  # fmt: skip
    try:
        wait_for(lambda: count(db, schema, "status = 'sent'") == 2, what="2 rows sent")
        sent = "messaging_client_sent_messages_total"
        wait_for(
            lambda: value(scrapes(port), sent, messaging_destination_name=topic) == 2,
            what="2 sends counted",
        )
        samples = scrape(port)
        # the backlog gauge is read by the relay's first upkeep, right at its start
        assert value(samples, "kinbox_outbox_pending", schema=schema) is not None
        assert value(samples, "target_info", service_name="kinbox-outbox-relay") == 1
    finally:
        assert stop_relay(relay) == 0
