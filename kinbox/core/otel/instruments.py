"""Making OpenTelemetry instruments from :mod:`.semconv`'s specs, and telling a no-op SDK apart.

Shared by the worker's telemetry and the outbox relay's. Only the API is
imported: without an SDK every instrument is a no-op, and
:func:`tracing_on` / :func:`metrics_on` say so, so the hot path can skip even
the clock reads and attribute dicts it would spend on nobody.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from kinbox.core.otel.semconv import Instrument

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


Observe = Callable[[Any], Iterable[Observation]]
"""A :class:`SharedGauge` owner's callback; it is given the owner (so it need not hold it)."""


class SharedGauge:
    """An observable gauge that several owners feed, each with a callback of its own.

    The SDK keeps one instrument per name and meter and ignores the callback
    of a second registration, so two workers (or relays) of one process —
    tests run many, one after another — cannot each register their own. They
    share this one: its callback asks every owner still watched. Owners are
    held weakly, so one that is gone stops being asked even if it never said;
    its callback is handed the owner, so it need not (and must not) hold it.
    """

    def __init__(self, meter: metrics.Meter, spec: Instrument) -> None:
        self._lock = threading.Lock()
        self._owners: weakref.WeakKeyDictionary[object, Observe] = weakref.WeakKeyDictionary()
        gauge(meter, spec, self._observe)

    def watch(self, owner: object, observe: Observe) -> None:
        """Ask ``observe(owner)`` at each collection until ``owner`` is forgotten or collected."""
        with self._lock:
            self._owners[owner] = observe

    def forget(self, owner: object) -> None:
        """Stop asking ``owner``."""
        with self._lock:
            self._owners.pop(owner, None)

    def _observe(self) -> Iterable[Observation]:
        with self._lock:
            watched = list(self._owners.items())
        return [observation for owner, observe in watched for observation in observe(owner)]


_SHARED: weakref.WeakKeyDictionary[metrics.Meter, dict[str, SharedGauge]] = (
    weakref.WeakKeyDictionary()
)
_SHARED_LOCK = threading.Lock()


def shared_gauge(meter: metrics.Meter, spec: Instrument) -> SharedGauge:
    """The :class:`SharedGauge` of ``spec`` on ``meter``, made on first use."""
    with _SHARED_LOCK:
        gauges = _SHARED.setdefault(meter, {})
        found = gauges.get(spec[0])
        if found is None:
            found = gauges[spec[0]] = SharedGauge(meter, spec)
        return found
