"""Turn the OpenTelemetry SDK on from the standard ``OTEL_*`` environment, at process start.

``kinbox worker`` and ``kinbox outbox relay`` call :func:`configure` before
they build anything, so an operator with the SDK installed (``pip install
'kinbox[otel]'``) turns tracing and metrics on without code::

    export OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp
    export OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317 OTEL_SERVICE_NAME=billing
    kinbox worker app:app

What is read, with the meaning the OpenTelemetry specification gives it:
``OTEL_SDK_DISABLED``; ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER``
(comma-separated names of installed exporters: ``otlp`` — by
``OTEL_EXPORTER_OTLP_PROTOCOL``, ``grpc`` or ``http/protobuf`` —,
``console``, ``prometheus``, or any other that registers itself under the
SDK's ``opentelemetry_*_exporter`` entry points; ``none`` or unset: that
signal stays off). The SDK's own classes then read the rest themselves:
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the resource;
``service.name`` defaults to the command's name), ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_EXPORTER_OTLP_*``.

Why not the SDK's auto-configuration (``opentelemetry.sdk._configuration``,
which ``opentelemetry-instrument`` runs)? It is private API, and it always
installs both providers: with only metrics asked for, a tracer provider
with no exporter would make every handler call build spans for nobody. A
signal nobody exports stays the API's no-op here, and kinbox's telemetry
then skips it entirely (:mod:`kinbox.core.otel.instruments`). Running under
``opentelemetry-instrument`` works too: a provider already installed (by it,
or by the application's own code) is left alone.

``metrics_port`` (``--metrics-port``) adds a Prometheus endpoint: the SDK's
Prometheus reader, served on every interface (``OTEL_EXPORTER_PROMETHEUS_HOST``
to choose one) at ``/metrics``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import metrics, trace

from kinbox.core.errors import ConfigurationError
from kinbox.core.otel.instruments import metrics_on, tracing_on

log = logging.getLogger(__name__)

_SIGNALS = {"traces": "TRACES", "metrics": "METRICS"}
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
_INSTALL = "pip install 'kinbox[otel]'"


def configure(service: str, metrics_port: int = 0) -> list[str]:
    """Install the SDK's providers that the environment (and ``metrics_port``) ask for.

    The environment is the process's: the SDK's classes read it too.

    Args:
        service: ``service.name`` unless ``OTEL_SERVICE_NAME`` or
            ``OTEL_RESOURCE_ATTRIBUTES`` name one.
        metrics_port: serve Prometheus' ``/metrics`` on this port (0: no endpoint).

    Returns:
        What was turned on, for the start-up log (empty: nothing).

    Raises:
        ConfigurationError: an exporter named that is not installed, or the
            metrics port cannot be served.
    """
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    traces = [] if tracing_on() else _names(env, "traces")
    readers = [] if metrics_on() else _names(env, "metrics")
    if metrics_port and metrics_on():
        log.warning("--metrics-port %d ignored: the application installed its own", metrics_port)
        metrics_port = 0
    if not (traces or readers or metrics_port):
        return []
    try:
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        log.warning(
            "OTEL_*_EXPORTER is set but the OpenTelemetry SDK is not installed: %s", _INSTALL
        )
        return []
    attributes: dict[str, Any] = {}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        attributes["service.name"] = service
    resource = Resource.create(attributes)
    done: list[str] = []
    if traces:
        done.append(_tracing(resource, traces, env))
    if readers or metrics_port:
        done.append(_metering(resource, readers, metrics_port, env))
    return done


def _names(env: Mapping[str, str], signal: str) -> list[str]:
    raw = env.get(f"OTEL_{_SIGNALS[signal]}_EXPORTER", "")
    return [name.strip() for name in raw.split(",") if name.strip() and name.strip() != "none"]


def _exporter(env: Mapping[str, str], signal: str, name: str) -> Any:
    """The exporter class registered as ``name`` for ``signal`` (the SDK's entry points)."""
    entry = name
    if name == "otlp":
        protocol = env.get(f"OTEL_EXPORTER_OTLP_{_SIGNALS[signal]}_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL"
        )
        if protocol:
            if protocol.strip() not in _OTLP_BY_PROTOCOL:
                raise ConfigurationError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not allowed: "
                    f"{' | '.join(_OTLP_BY_PROTOCOL)}"
                )
            entry = _OTLP_BY_PROTOCOL[protocol.strip()]
    found = list(entry_points(group=f"opentelemetry_{signal}_exporter", name=entry))
    if not found:
        raise ConfigurationError(
            f"OTEL_{_SIGNALS[signal]}_EXPORTER={name!r}: no such exporter is installed ({_INSTALL})"
        )
    return found[0].load()


def _tracing(resource: Any, names: list[str], env: Mapping[str, str]) -> str:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource)  # its sampler comes from OTEL_TRACES_SAMPLER
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(env, "traces", name)()))
    trace.set_tracer_provider(provider)
    return f"traces to {', '.join(names)}"


def _metering(resource: Any, names: list[str], port: int, env: Mapping[str, str]) -> str:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader

    readers: list[MetricReader] = []
    for name in names:
        found = _exporter(env, "metrics", name)
        readers.append(
            found() if issubclass(found, MetricReader) else PeriodicExportingMetricReader(found())
        )
    said = [*names]
    if port:
        readers.append(_prometheus(port, env))
        said.append(f"Prometheus on :{port}/metrics")
    metrics.set_meter_provider(MeterProvider(metric_readers=readers, resource=resource))
    return f"metrics to {', '.join(said)}"


def _prometheus(port: int, env: Mapping[str, str]) -> Any:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        raise ConfigurationError(
            f"--metrics-port needs opentelemetry-exporter-prometheus: {_INSTALL}"
        ) from None
    reader = PrometheusMetricReader()
    # Every interface by default, as Prometheus exporters do: it is a scrape target.
    host = env.get("OTEL_EXPORTER_PROMETHEUS_HOST") or "0.0.0.0"
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        raise ConfigurationError(f"--metrics-port {port}: cannot listen on {host}: {exc}") from exc
    return reader
