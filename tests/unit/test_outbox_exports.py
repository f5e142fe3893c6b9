from __future__ import annotations

import ast
from pathlib import Path

import pytest

import producer_outbox
from tests.support.exports import assert_exports_complete, fresh_interpreter


def test_all_is_sorted_and_complete() -> None:
    # isort order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions.
    def order(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert_exports_complete(producer_outbox, order)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = producer_outbox.nope


def test_a_writer_loads_psycopg_and_nothing_of_kafka_or_the_relay() -> None:
    # Given a fresh interpreter, when a writer-only service imports enqueue,
    # then psycopg is loaded, and neither confluent-kafka, nor kinbox's Kafka
    # seam, nor any producer_outbox module beyond the writer's own.
    writer = {"producer_outbox", "producer_outbox.writer"}
    writer |= {"producer_outbox.debezium"}  # the CDC constraint's name, in the writer's errors
    writer |= {"producer_outbox.trace_context"}  # the span's W3C context, stored with the row
    writer |= {"producer_outbox.ids"}  # the default event id
    code = (
        "import sys\nfrom producer_outbox import enqueue\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('confluent_kafka', 'kinbox.kafka', 'producer_outbox', 'psycopg'))))\n"
    )
    loaded = set(ast.literal_eval(fresh_interpreter(code)))
    assert "psycopg" in loaded
    assert not {m for m in loaded if m.startswith(("confluent_kafka", "kinbox.kafka"))}
    assert {m for m in loaded if m.startswith("producer_outbox")} == writer


def test_never_imports_consumer_code() -> None:
    # kinbox.kafka.errors is a leaf (confluent-kafka and the error tree): the
    # one place that reads fatal errors and refused configurations.
    # kinbox.core.failpoints (the one failpoint grammar) and kinbox.core.lazy (lazy
    # exports) are shared and import nothing of the consumer; kinbox.core.cause
    # (which inbox event a handler works for) is a leaf the writer reads, and
    # kinbox.store.errors (whose fault a PostgreSQL error is) a leaf it judges by.
    # The relay's command serves kinbox.ops.health's endpoints, which import
    # only the Kafka seam's types, with kinbox.store.probe's database check,
    # and logs through kinbox.ops.logs, as every kinbox command does; the
    # cleanup reads topics' retention through kinbox.kafka.inspect (admin only).
    # kinbox.core.otel (the names of spans and metrics, trace context in headers,
    # the SDK set up from OTEL_*) is shared too and imports nothing of the consumer.
    # The relay publishes through the one publisher: the seam
    # (kinbox.core.publisher) and kinbox.kafka.publisher, on the producer only.
    allowed = {
        "kinbox.core.publisher",
        "kinbox.kafka.publisher",
        "kinbox.core.cause",
        "kinbox.core.errors",
        "kinbox.ops.health",
        "kinbox.ops.logs",
        "kinbox.store.probe",
        "kinbox.store.errors",
        "kinbox.core.otel",
        "kinbox.core.otel.instruments",
        "kinbox.core.otel.propagation",
        "kinbox.core.otel.semconv",
        "kinbox.core.otel.setup",
        "kinbox.core.failpoints",
        "kinbox.kafka.inspect",
        "kinbox.kafka.errors",
        "kinbox.core.lazy",
        "kinbox.core.names",
        "kinbox.store.migrations",
    }
    package = Path(producer_outbox.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert not name.startswith("kinbox") or name in allowed, (path.name, name)
