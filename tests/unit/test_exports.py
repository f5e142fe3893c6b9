from __future__ import annotations

import pytest

import kinbox
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
        "kinbox.kafka.consumer", "kinbox.kafka.producer", "kinbox.kafka.reader", "kinbox.config",
        "kinbox.consume.envelope", "kinbox.event", "kinbox.middleware.base",
        "kinbox.middleware.telemetry", "opentelemetry",
    ]  # fmt: skip
    code = (
        f"import sys, producer_outbox\nprint(sorted(m for m in {consumer!r} if m in sys.modules))\n"
    )
    assert fresh_interpreter(code).strip() == "[]"


def test_kinbox_testing_exports_every_fake_documented_and_loads_no_kafka_client() -> None:
    # Given a fresh interpreter, when a user's test imports the fakes, then
    # the names are sorted, complete and documented, and librdkafka stays unloaded.
    code = (
        "import sys, types, kinbox.testing as t\n"
        "public = {n for n, v in vars(t).items()\n"
        "          if not n.startswith('_') and not isinstance(v, types.ModuleType)}\n"
        "print(t.__all__ == sorted(t.__all__), public == set(t.__all__),\n"
        "      all(getattr(t, n).__doc__ for n in t.__all__), 'confluent_kafka' in sys.modules)\n"
    )
    assert fresh_interpreter(code).split() == ["True", "True", "True", "False"]
