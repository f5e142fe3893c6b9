"""The ``process <topic>`` span of a handler call: its attributes, links and parent.

A per-event call gets the event's own attributes (id, offset, key,
``kinbox.attempt``); a batch handler's call gets ``messaging.batch.message_count``
and one link per event's creation context (each link naming its event).
The parent is the current span (the partition batch's) unless ``parent`` is
asked and there is exactly one creation context to continue: the
conventions allow a message's creation context as parent only for a single
message, and ask that the ambient span then become a link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from kinbox.core.describe import describe
from kinbox.core.otel import semconv as sc
from kinbox.core.otel.propagation import as_parent, creation_context
from kinbox.core.otel.semconv import error_type, key_text

if TYPE_CHECKING:
    from kinbox.core.event import Event

MAX_LINKS = 128
"""Most creation contexts a batch handler's span links (the SDK's default link limit)."""

Attributes = dict[str, AttributeValue]


def process_span(
    tracer: trace.Tracer,
    events: Sequence[Event],
    where: Mapping[str, AttributeValue],
    *,
    each: bool,
    parent: bool,
) -> trace.Span:
    """Start the CONSUMER span of one handler call over ``events``.

    Args:
        tracer: where the span goes.
        events: the call's events (one, for a per-event handler).
        where: the partition's attributes (system, topic, partition, group).
        each: a per-event handler's call: the event's own attributes.
        parent: continue the producer's trace when one creation context is there.
    """
    first = events[0]
    attributes: Attributes = {
        **where, sc.OPERATION_TYPE: sc.PROCESS, sc.OPERATION_NAME: sc.PROCESS,
        sc.ATTEMPT: first.attempt,
    }  # fmt: skip
    links: list[trace.Link] = []
    if each:
        attributes.update({sc.OFFSET: first.offset, sc.MESSAGE_ID: first.id, sc.DUPLICATE: False})
        key = key_text(first.key)
        if key is not None:
            attributes[sc.MESSAGE_KEY] = key
        creation = creation_context(first.headers)
        if creation is not None:
            links.append(trace.Link(creation))
    else:
        attributes[sc.BATCH_COUNT] = len(events)
        for event in events[:MAX_LINKS]:
            creation = creation_context(event.headers)
            if creation is not None:
                named: Attributes = {sc.MESSAGE_ID: event.id, sc.OFFSET: event.offset}
                links.append(trace.Link(creation, named))
    context: Context | None = None
    if parent and len(events) == 1 and links:
        ambient = trace.get_current_span().get_span_context()
        context = as_parent(links[0].context)
        if ambient.is_valid:
            links.append(trace.Link(ambient))
    return tracer.start_span(
        f"{sc.PROCESS} {first.topic}",
        context=context,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
    )


def mark_failed(span: trace.Span, error: BaseException) -> None:
    """Record ``error`` on ``span``: ``error.type``, an error status, the exception event."""
    span.set_attribute(sc.ERROR_TYPE, error_type(error))
    span.set_status(trace.Status(trace.StatusCode.ERROR, describe(error)))
    span.record_exception(error)
