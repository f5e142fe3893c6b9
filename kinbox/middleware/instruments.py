"""Making OpenTelemetry instruments from :mod:`.semconv`'s specs, and telling a no-op SDK apart.

Shared by the worker's telemetry and the outbox relay's. Only the API is
imported: without an SDK every instrument is a no-op, and
:func:`tracing_on` / :func:`metrics_on` say so, so the hot path can skip even
the clock reads and attribute dicts it would spend on nobody.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from kinbox.middleware.semconv import Instrument

_API_PACKAGES = ("opentelemetry.trace", "opentelemetry.metrics")


def _from_the_api(provider: object) -> bool:
    # The API's own providers are its no-op and its proxy (which stands in
    # until an SDK is set); any other provider is an SDK's.
    return type(provider).__module__.startswith(_API_PACKAGES)


def tracing_on(provider: trace.TracerProvider | None = None) -> bool:
    """Whether spans go anywhere: ``provider`` (default: the global one) is not the API's no-op."""
    return not _from_the_api(provider or trace.get_tracer_provider())


def metrics_on(provider: metrics.MeterProvider | None = None) -> bool:
    """Whether measurements go anywhere: ``provider`` (default: the global one) is an SDK's."""
    return not _from_the_api(provider or metrics.get_meter_provider())


def counter(meter: metrics.Meter, spec: Instrument) -> metrics.Counter:
    """A counter named, united and described by ``spec``."""
    name, unit, description = spec
    return meter.create_counter(name, unit=unit, description=description)


def histogram(
    meter: metrics.Meter, spec: Instrument, buckets: Sequence[float]
) -> metrics.Histogram:
    """A histogram for ``spec``, advising ``buckets`` as its boundaries."""
    name, unit, description = spec
    return meter.create_histogram(
        name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
    )


def gauge(
    meter: metrics.Meter, spec: Instrument, observe: Callable[[], Iterable[Observation]]
) -> metrics.ObservableGauge:
    """An observable gauge for ``spec``; ``observe`` runs on the metric reader's thread."""
    name, unit, description = spec

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return list(observe())

    return meter.create_observable_gauge(
        name, callbacks=[callback], unit=unit, description=description
    )
