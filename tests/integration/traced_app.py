"""A kinbox app whose handler traces its own statement, as an instrumented service would.

The handler opens a span around its INSERT (what psycopg's instrumentation
would do), so a test can see the handler's database work as a child of
kinbox's ``process`` span. Like :mod:`tests.integration.inbox_app`, it is
configured by env for a ``kinbox worker`` subprocess: ``INBOX_TEST_TOPIC``,
``KINBOX_SCHEMA``, ``KINBOX_GROUP_ID``; it writes the shared ``effects`` table.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace

from kinbox import App, Event
from kinbox.middleware.telemetry import Telemetry
from tests.integration.inbox_app import recorder

STATEMENT_SPAN = "INSERT effects"


def make_app(
    topic: str, schema: str, group_id: str, tracer_provider: trace.TracerProvider | None = None
) -> App:
    """The app; with ``tracer_provider``, kinbox's telemetry and the handler's spans go there."""
    layers = None if tracer_provider is None else [Telemetry(tracer_provider=tracer_provider)]
    app = App(group_id=group_id, schema=schema, middleware=layers)
    tracer = trace.get_tracer("tests.traced_app", tracer_provider=tracer_provider)
    record = recorder(schema, group_id)

    @app.handler(topic)
    def record_effect(event: Event, tx: Any) -> None:
        with tracer.start_as_current_span(STATEMENT_SPAN, kind=trace.SpanKind.CLIENT):
            record(event, tx)

    return app


app = make_app(
    os.environ.get("INBOX_TEST_TOPIC", "inbox-test"),
    os.environ.get("KINBOX_SCHEMA", "kinbox"),
    os.environ.get("KINBOX_GROUP_ID", "inbox-test"),
)
