"""OpenTelemetry as a middleware: spans for every batch and handler call, and the metrics.

Spans (names and attributes in :mod:`kinbox.core.otel.semconv`; the messaging
conventions' current names):

- ``kinbox.batch`` (INTERNAL), one per partition batch, current while it
  runs: ``kinbox.claim`` and ``kinbox.commit`` are its children (a batch
  redone or narrowed down has several), and so is whatever the handler
  starts when the handler's span is linked instead (below). A delivery the
  inbox suppressed is a ``kinbox.duplicate`` span event on it (message id,
  offset) plus a link to that record's creation context; a dead letter is a
  ``kinbox.dead_letter`` event.
- ``process <topic>`` (CONSUMER), one per handler call: per event, with
  ``messaging.message.id``, ``messaging.kafka.offset``, the key, the
  partition, ``kinbox.attempt`` (the event's try as the failure policy
  counts it; a handler called again because its batch was redone gets a
  second span with the same attempt), ``kinbox.duplicate`` (false: a
  duplicate never reaches a handler) and ``error.type`` when the handler
  raised; per batch handler call, one span with ``messaging.batch.message_count``
  and a link to each event's creation context (at most
  :data:`~kinbox.middleware.spans.MAX_LINKS`).
  Its parent is the record's creation context (its ``traceparent``) or the
  batch span, by ``trace_context`` (:data:`kinbox.core.config.TRACE_CONTEXT_MODES`);
  parented on the producer, it links the batch span, as the conventions ask
  of a process span run inside another span.

Why duplicates are span events and not ``process`` spans: the conventions
define a process span as the application being handed a message, and
``messaging.process.duration`` as that call's duration; a duplicate is never
handed to the handler, so a span for it would report a processing that did
not happen and skew the duration histogram with calls that do nothing. The
batch span, which covers every record of the batch, links the duplicate's
creation context instead, so the producer's trace still leads to it.

Metrics (:mod:`.meters`; units and descriptions in :mod:`kinbox.core.otel.semconv`):
``messaging.process.duration`` and ``messaging.client.consumed.messages``
(the conventions'), kinbox's
counters ``kinbox.events.received``, ``.applied``, ``.duplicate``,
``.dead_lettered`` (label ``topic``), ``kinbox.batches.failed`` (``topic``,
``kind``: ``handler``, ``store``, ``dead-letter``, ``envelope``, or ``error``
when something raised out of the batch), ``kinbox.dead_letters.undeliverable``
(``topic`` the dead-letter topic, ``source_topic``), the histograms
``kinbox.batch.size``, ``kinbox.claim.duration``, ``kinbox.commit.duration``,
and the gauge ``kinbox.consumer.lag`` (``group``, ``topic``, ``partition``),
read from the Kafka client's statistics.

Only the API is used. With no SDK configured the providers are the API's
no-ops: that is found out when the worker starts, and then no span is made,
no clock is read and the handler is called straight through.
:class:`Telemetry` is installed on every :class:`~kinbox.app.App` unless
``App(middleware=[...])`` leaves it out; ``Telemetry(tracer_provider=...,
meter_provider=...)`` uses providers of your own.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import context, metrics, trace
from opentelemetry.context import Context

from kinbox.core.describe import describe
from kinbox.core.otel import semconv as sc
from kinbox.core.otel.instruments import metrics_on, tracing_on
from kinbox.core.otel.propagation import creation_context
from kinbox.core.otel.semconv import error_type
from kinbox.middleware.base import Middleware, WorkerInfo
from kinbox.middleware.meters import Meters
from kinbox.middleware.spans import Attributes, mark_failed, process_span

if TYPE_CHECKING:
    from kinbox.core.event import Event
    from kinbox.core.letter import Letter
    from kinbox.core.outcome import BatchResult, Step
    from kinbox.core.record import Record


@dataclass
class _Open:
    """A partition batch in flight: its span, the token that made it current, its duplicates."""

    span: trace.Span
    token: Token[Context]
    duplicates: set[int] = field(default_factory=set)


class Telemetry(Middleware):
    """Traces batches and handler calls and counts what became of them (see the module doc).

    Args:
        tracer_provider: where spans go; ``None``: the global provider.
        meter_provider: where metrics go; ``None``: the global provider.
        trace_context: ``auto``, ``parent`` or ``link``
            (:data:`kinbox.core.config.TRACE_CONTEXT_MODES`); ``None``: the
            worker's ``trace_context`` setting.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        trace_context: str | None = None,
    ) -> None:
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._tracer = trace.get_tracer("kinbox", tracer_provider=tracer_provider)
        self._meters = Meters(metrics.get_meter("kinbox", meter_provider=meter_provider))
        self._mode_given = trace_context
        self._group: str | None = None
        # Keyed by partition: batches of one partition never overlap, while
        # batches of different partitions may be in flight at once.
        self._open: dict[tuple[str, int], _Open] = {}
        self._configure("auto")

    # -- the worker --

    def before_worker_start(self, worker: WorkerInfo) -> None:
        """Learn the group, the lag board and the trace mode; see whether an SDK listens."""
        self._group = worker.group_id or None
        settings = worker.settings
        self._configure(settings.trace_context if settings is not None else "auto")
        self._meters.start(self, self._group, worker.lag)

    def after_worker_stop(self, worker: WorkerInfo, error: BaseException | None) -> None:
        """Stop reporting this worker's lag."""
        self._meters.stop(self)

    def _configure(self, mode: str) -> None:
        # Decided once per start, not per call: with no SDK the handler is
        # called straight through.
        mode = self._mode_given or mode
        self._tracing = tracing_on(self._tracer_provider)
        self._metering = metrics_on(self._meter_provider)
        self._watching = self._tracing or self._metering
        self._parent_events = mode in ("auto", "parent")
        self._parent_batches = mode == "parent"

    # -- a partition batch --

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Count the records received and start the batch's span."""
        self._meters.received(topic, len(records), all_of_them=self._metering)
        if not self._tracing:
            return
        attributes: Attributes = {
            **self._where(topic, partition),
            sc.BATCH_COUNT: len(records),
            sc.FIRST_OFFSET: records[0].offset,
            sc.LAST_OFFSET: records[-1].offset,
        }
        span = self._tracer.start_span(sc.BATCH_SPAN, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span))
        self._open[(topic, partition)] = _Open(span, token)

    def after_step(self, step: Step) -> None:
        """Time the claim or COMMIT; trace it as a child of the batch's span, with duplicates."""
        if self._metering:
            self._meters.step(step)
        opened = self._open.get((step.topic, step.partition))
        if opened is None:
            return
        attributes: Attributes = {sc.CLAIMED: len(step.events)}
        if step.fresh is not None:
            attributes[sc.FRESH] = len(step.fresh)
        span = self._tracer.start_span(
            sc.CLAIM_SPAN if step.name == "claim" else sc.COMMIT_SPAN,
            context=trace.set_span_in_context(opened.span),
            attributes=attributes,
            start_time=step.started,
        )
        if step.error is not None:
            mark_failed(span, step.error)
        span.end(end_time=step.ended)
        if step.fresh is not None and len(step.fresh) < len(step.events):
            self._mark_duplicates(opened, step)

    def _mark_duplicates(self, opened: _Open, step: Step) -> None:
        fresh = {event.offset for event in step.fresh or ()}
        for event in step.events:
            # A redone batch claims again: each duplicate is reported once.
            if event.offset in fresh or event.offset in opened.duplicates:
                continue
            opened.duplicates.add(event.offset)
            attributes: Attributes = {
                sc.MESSAGE_ID: event.id, sc.OFFSET: event.offset, sc.DUPLICATE: True,
            }  # fmt: skip
            opened.span.add_event(sc.DUPLICATE_EVENT, attributes, timestamp=step.ended)
            creation = creation_context(event.headers)
            if creation is not None:
                opened.span.add_link(creation, attributes)

    def after_dead_letter(self, letter: Letter) -> None:
        """Note the dead letter on the batch's span."""
        record = letter.record
        opened = self._open.get((record.topic, record.partition))
        if opened is not None:
            opened.span.add_event(
                sc.DEAD_LETTER_EVENT,
                {
                    sc.OFFSET: record.offset,
                    sc.REASON: letter.reason,
                    sc.DEAD_LETTER_TOPIC: letter.target,
                },
            )

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None,
    ) -> None:
        """Count the outcome and end the span (an error status when the batch stopped)."""
        self._meters.settled(topic, result, error)
        opened = self._open.pop((topic, partition), None)
        if opened is None:
            return
        context.detach(opened.token)
        span = opened.span
        span.set_attributes(
            {
                sc.APPLIED: result.applied,
                sc.DUPLICATES: result.duplicates,
                sc.DEAD_LETTERED: result.dead_lettered,
            }
        )
        failure = result.failure
        cause = error if error is not None else (None if failure is None else failure.error)
        if cause is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, describe(cause)))
            span.set_attribute(sc.ERROR_TYPE, error_type(cause))
            if error is not None:
                span.record_exception(error)
        span.end()

    # -- handler calls --

    def around_event(self, event: Event, call_next: Callable[[Event], object]) -> object:
        """Run one per-event handler call inside its ``process`` span, timed."""
        if not self._watching:
            return call_next(event)
        timing = self._start((event,), each=True)
        try:
            result = call_next(event)
        except BaseException as exc:
            timing.end(exc)
            raise  # unchanged: the failure policy judges exactly what the handler raised
        timing.end(None)
        return result

    def around_events(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], object]
    ) -> object:
        """Run one batch handler call inside its ``process`` span, timed."""
        if not self._watching or not events:
            return call_next(events)
        timing = self._start(events, each=False)
        try:
            result = call_next(events)
        except BaseException as exc:
            timing.end(exc)
            raise
        timing.end(None)
        return result

    async def around_event_async(
        self, event: Event, call_next: Callable[[Event], Awaitable[object]]
    ) -> object:
        """Await one async per-event handler call inside its ``process`` span, timed."""
        if not self._watching:
            return await call_next(event)
        timing = self._start((event,), each=True)
        try:
            result = await call_next(event)
        except BaseException as exc:
            timing.end(exc)
            raise
        timing.end(None)
        return result

    async def around_events_async(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], Awaitable[object]]
    ) -> object:
        """Await one async batch handler call inside its ``process`` span, timed."""
        if not self._watching or not events:
            return await call_next(events)
        timing = self._start(events, each=False)
        try:
            result = await call_next(events)
        except BaseException as exc:
            timing.end(exc)
            raise
        timing.end(None)
        return result

    def _start(self, events: Sequence[Event], *, each: bool) -> _Timing:
        """Open the call's span (when tracing), make it current, start the clock."""
        span = None
        if self._tracing:
            where = self._where(events[0].topic, events[0].partition)
            parent = self._parent_events if each else self._parent_batches
            span = process_span(self._tracer, events, where, each=each, parent=parent)
        token = None if span is None else context.attach(trace.set_span_in_context(span))
        meters = self._meters if self._metering else None
        return _Timing(events[0].topic, span, token, meters)

    def _where(self, topic: str, partition: int) -> Attributes:
        """The attributes every span of a partition carries."""
        attributes: Attributes = {
            sc.MESSAGING_SYSTEM: sc.KAFKA,
            sc.DESTINATION: topic,
            sc.PARTITION: str(partition),
        }
        if self._group is not None:
            attributes[sc.CONSUMER_GROUP] = self._group
        return attributes


class _Timing:
    """One handler call's span and clock, from :meth:`Telemetry._start` to :meth:`end`."""

    __slots__ = ("_meters", "_span", "_started", "_token", "_topic")

    def __init__(
        self,
        topic: str,
        span: trace.Span | None,
        token: Token[Context] | None,
        meters: Meters | None,
    ) -> None:
        self._topic = topic
        self._span = span
        self._token = token
        self._meters = meters
        self._started = time.perf_counter()

    def end(self, error: BaseException | None) -> None:
        """Detach and end the span, and count the call, failed with ``error`` or not."""
        if self._token is not None:
            context.detach(self._token)
        if self._meters is not None:
            self._meters.processed(self._topic, time.perf_counter() - self._started, error)
        if self._span is not None:
            if error is not None:
                mark_failed(self._span, error)
            self._span.end()
