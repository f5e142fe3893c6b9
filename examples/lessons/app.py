"""The progress service: applies ``lesson-events`` events to ``lesson_progress`` exactly once.

Run it with ``kinbox worker examples.lessons.app:app`` after ``kinbox migrate``
and :func:`create_tables`. ``lesson_applications`` counts every time the handler's
transaction commits, so a duplicate application would be visible there even
though ``lesson_progress`` itself is idempotent.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from confluent_kafka import Producer

from kinbox import App, Event

TOPIC = "lesson-events"

app = App(group_id="progress-service")

DDL = """
CREATE TABLE IF NOT EXISTS lesson_progress (
    user_id text NOT NULL,
    lesson_id text NOT NULL,
    completed_at timestamptz NOT NULL,
    PRIMARY KEY (user_id, lesson_id)
);
CREATE TABLE IF NOT EXISTS lesson_applications (
    event_id text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS lesson_completions (
    user_id text NOT NULL,
    lesson_id text NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, lesson_id)
);
"""


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """Create the example's business tables (idempotent)."""
    conn.execute(DDL)


@app.handler(TOPIC)
def lesson_completed(event: Event, tx: psycopg.Connection[Any]) -> None:
    """Record the user's progress; runs inside the inbox transaction."""
    payload = event.json()
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id, completed_at)"
        " VALUES (%s, %s, coalesce(to_timestamp(%s / 1000.0), now())) ON CONFLICT DO NOTHING",
        (payload["userId"], payload["lessonId"], payload.get("completedAt")),
    )
    tx.execute("INSERT INTO lesson_applications (event_id) VALUES (%s)", (event.id,))


def complete_lesson(
    conn: psycopg.Connection[Any], producer: Producer, user_id: str, lesson_id: str
) -> str:
    """The CompleteLesson use case: store the completion, then publish the event.

    A plain producer for now: the event is sent after the commit, so a crash in
    between loses it (the outbox closes that gap; see producer_outbox). The
    event id travels in the ``event-id`` header, which the inbox deduplicates on.

    Returns:
        The event id.
    """
    event_id = str(uuid.uuid4())
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO lesson_completions (user_id, lesson_id) VALUES (%s, %s)"
            " ON CONFLICT (user_id, lesson_id) DO UPDATE SET user_id = EXCLUDED.user_id"
            " RETURNING (extract(epoch FROM completed_at) * 1000)::bigint",
            (user_id, lesson_id),
        ).fetchone()
    assert row is not None
    payload = {"userId": user_id, "lessonId": lesson_id, "completedAt": int(row[0])}
    producer.produce(
        TOPIC,
        key=user_id.encode(),
        value=json.dumps(payload).encode(),
        headers=[("event-id", event_id.encode())],
    )
    producer.poll(0)
    return event_id
