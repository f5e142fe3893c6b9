"""The SDK set up from OTEL_* at process start (each case in a fresh interpreter: global state)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from tests.support.exports import fresh_interpreter

pytestmark = pytest.mark.unit

PROBE = """
import json, os
os.environ.update({env!r})
from kinbox.core.errors import ConfigurationError
from kinbox.core.otel.instruments import metrics_on, tracing_on
from kinbox.core.otel.setup import configure
try:
    done = configure("kinbox-worker", {port})
except ConfigurationError as exc:
    done = ["error: " + str(exc)]
from opentelemetry import trace
resource = getattr(trace.get_tracer_provider(), "resource", None)
name = resource.attributes.get("service.name") if resource is not None else None
print(json.dumps([done, tracing_on(), metrics_on(), name]))
"""


def configured(env: dict[str, str], port: int = 0) -> list[Any]:
    return list(json.loads(fresh_interpreter(PROBE.format(env=env, port=port))))


def test_nothing_is_set_up_unless_an_exporter_is_named() -> None:
    assert configured({}) == [[], False, False, None]
    assert configured({"OTEL_TRACES_EXPORTER": "none"}) == [[], False, False, None]


def test_a_named_exporter_turns_on_its_signal_only() -> None:
    # Only traces asked for: the meter provider stays the API's no-op, so
    # the worker spends nothing on metrics nobody reads (and vice versa).
    assert configured({"OTEL_TRACES_EXPORTER": "console"}) == [
        ["traces to console"], True, False, "kinbox-worker",
    ]  # fmt: skip
    done, tracing, metering, _ = configured({"OTEL_METRICS_EXPORTER": "console"})
    assert (done, tracing, metering) == (["metrics to console"], False, True)


def test_the_service_name_and_the_kill_switch_come_from_the_environment() -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing"}
    assert configured(env)[3] == "billing"
    assert configured({**env, "OTEL_SDK_DISABLED": "true"}) == [[], False, False, None]


def test_an_exporter_that_is_not_installed_is_a_configuration_error() -> None:
    [done, *_] = configured({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert done == [
        "error: OTEL_TRACES_EXPORTER='zipkin': no such exporter is installed "
        "(pip install 'kinbox[otel]')"
    ]


def test_metrics_port_serves_prometheus_and_a_taken_port_is_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1"}
        [done, tracing, metering, _] = configured(env, port)
    assert tracing is False and metering is False
    [error] = done
    assert error.startswith(f"error: --metrics-port {port}: cannot listen on 127.0.0.1:")
