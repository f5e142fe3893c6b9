"""The progress service: CompleteLesson writes through the outbox; a handler applies it once.

Run it with ``kinbox worker examples.lessons.app:app`` after ``kinbox migrate``
and :func:`create_tables`. ``lesson_applications`` counts every time the handler's
transaction commits, so a duplicate application would be visible there even
though ``lesson_progress`` itself is idempotent.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from kinbox import App, Event
from producer_outbox import enqueue

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
    conn: psycopg.Connection[Any], user_id: str, lesson_id: str, *, schema: str = "kinbox"
) -> uuid.UUID:
    """The CompleteLesson use case: store the completion and its event in one transaction.

    The event goes into the outbox table, not straight to Kafka: if the
    transaction rolls back there is no event, and if it commits the relay
    (``kinbox outbox relay``) publishes it at least once, even across crashes.
    Its event id travels in the ``event-id`` header, which the inbox
    deduplicates on, so "at least once" becomes "exactly once" in effect.

    Returns:
        The event id.
    """
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO lesson_completions (user_id, lesson_id) VALUES (%s, %s)"
            " ON CONFLICT (user_id, lesson_id) DO UPDATE SET user_id = EXCLUDED.user_id"
            " RETURNING (extract(epoch FROM completed_at) * 1000)::bigint",
            (user_id, lesson_id),
        ).fetchone()
        assert row is not None
        payload = {
            "event": "lesson.completed",
            "userId": user_id,
            "lessonId": lesson_id,
            "completedAt": int(row[0]),
        }
        # key = user: one user's events stay in order, on one partition.
        return enqueue(conn, TOPIC, payload, key=user_id, schema=schema)
