from __future__ import annotations

import pytest

import kinbox
import kinbox.testing
from tests.support.exports import assert_exports_complete, fresh_interpreter

pytestmark = pytest.mark.unit


def test_all_is_sorted_and_complete() -> None:
    assert_exports_complete(kinbox)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = kinbox.nope


def test_importing_producer_outbox_loads_no_consumer_module() -> None:
    consumer = [
        "kinbox.app", "kinbox.consume.runner", "kinbox.apply.batch", "kinbox.store.postgres",
        "kinbox.kafka.consumer", "kinbox.kafka.publisher", "kinbox.kafka.reader",
        "kinbox.core.config", "kinbox.apply.envelope", "kinbox.core.event",
        "kinbox.middleware.base",
        "kinbox.middleware.telemetry", "opentelemetry",
    ]  # fmt: skip
    code = (
        f"import sys, producer_outbox\nprint(sorted(m for m in {consumer!r} if m in sys.modules))\n"
    )
    assert fresh_interpreter(code).strip() == "[]"


def test_kinbox_testing_all_is_sorted_complete_and_documented() -> None:
    # isort order, as ruff's RUF022 keeps it: CONSTANTS, Classes, functions.
    def order(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert_exports_complete(kinbox.testing, order)
    undocumented = [n for n in kinbox.testing.__all__ if not getattr(kinbox.testing, n).__doc__]
    assert undocumented == []


def test_kinbox_testing_loads_no_kafka_client_even_with_every_name() -> None:
    # Given a fresh interpreter, when a user's test takes every name of the
    # kit, then librdkafka stays unloaded: the kit needs no broker.
    code = (
        "import sys, kinbox.testing as t\n"
        "[getattr(t, n) for n in t.__all__]\n"
        "print('confluent_kafka' in sys.modules)\n"
    )
    assert fresh_interpreter(code).split() == ["False"]


def test_the_pytest_plugin_loads_neither_psycopg_nor_the_launcher() -> None:
    # Given a fresh interpreter, when pytest loads the plugin (every session
    # of a project with kinbox installed does), then nothing heavy comes with it.
    code = (
        "import sys, kinbox.testing.pytest_plugin\n"
        "heavy = ['psycopg', 'psycopg_pool', 'confluent_kafka', 'opentelemetry',\n"
        "         'kinbox.devstack', 'kinbox.testing.client', 'kinbox.testing.store']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    assert fresh_interpreter(code).strip() == "[]"
