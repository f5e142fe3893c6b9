"""A kinbox app for the inbox integration tests: one handler recording every application.

``effects`` has no unique constraint on the event id, on purpose: an event
applied twice shows up as two rows. Configured by env so a ``kinbox worker``
subprocess can run it: ``INBOX_TEST_TOPIC``, ``KINBOX_SCHEMA``,
``KINBOX_GROUP_ID``, ``INBOX_TEST_SLEEP`` (seconds per event, to stretch batches).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from psycopg import sql

from kinbox import App, Event


def make_app(topic: str, schema: str, group_id: str, sleep: float = 0.0) -> App:
    app = App(group_id=group_id, schema=schema)
    record = recorder(schema, group_id)

    @app.handler(topic)
    def record_effect(event: Event, tx: Any) -> None:
        if sleep:
            time.sleep(sleep)
        record(event, tx)

    return app


def recorder(schema: str, group_id: str) -> Callable[[Event, Any], None]:
    """What the handler does: one ``effects`` row for the event, in the inbox transaction."""
    insert = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(schema))

    def record(event: Event, tx: Any) -> None:
        tx.execute(
            insert,
            (group_id, event.id, event.topic, event.partition, event.offset, os.getpid()),
        )

    return record


app = make_app(
    os.environ.get("INBOX_TEST_TOPIC", "inbox-test"),
    os.environ.get("KINBOX_SCHEMA", "kinbox"),
    os.environ.get("KINBOX_GROUP_ID", "inbox-test"),
    float(os.environ.get("INBOX_TEST_SLEEP", "0")),
)
