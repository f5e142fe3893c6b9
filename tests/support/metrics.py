"""kinbox's counters as an application's OpenTelemetry SDK would see them, in memory.

kinbox uses only the OpenTelemetry API; a test that asserts a counter installs
the SDK's meter provider with an in-memory reader. The global provider can be
set once per process, so one reader serves every test of the session; each
test reads the counters for its own (unique) topic.
"""

from __future__ import annotations

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum

_reader: InMemoryMetricReader | None = None


def install() -> None:
    """Install the in-memory reader as the global meter provider (once per process)."""
    global _reader
    if _reader is None:
        _reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))


def counted(name: str, **labels: str) -> int:
    """Total of counter ``name`` over the points whose attributes include ``labels``."""
    assert _reader is not None, "install() first"
    data = _reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name or not isinstance(metric.data, Sum):
                    continue
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if all(attributes.get(k) == v for k, v in labels.items()):
                        total += int(point.value)
    return total
