"""The progress service's handler as an ``async def``: the same effect, on an ``AsyncConnection``.

The same CompleteLesson events and tables as :mod:`examples.lessons.app`, and
the typed payload of :mod:`examples.lessons.app_pydantic`. An ``async def``
handler receives a psycopg ``AsyncConnection`` inside the inbox transaction
and awaits its statements; kinbox runs it on an event loop with the same
claim, transaction, offsets and dead letters as a sync handler (an app may
mix both). Run it with ``kinbox worker examples.lessons.app_async:app``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from examples.lessons.app import TOPIC
from examples.lessons.app_pydantic import LessonCompleted
from kinbox import App, Event

app = App(group_id="progress-service")


@app.handler(TOPIC)
async def lesson_completed(
    lesson: LessonCompleted, tx: psycopg.AsyncConnection[Any], event: Event
) -> None:
    """Record the user's progress; runs inside the inbox transaction."""
    await tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id, completed_at)"
        " VALUES (%s, %s, coalesce(%s, now())) ON CONFLICT DO NOTHING",
        (lesson.user_id, lesson.lesson_id, lesson.completed_at),
    )
    await tx.execute("INSERT INTO lesson_applications (event_id) VALUES (%s)", (event.id,))
