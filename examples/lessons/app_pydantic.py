"""The progress service's handler with a typed payload: a pydantic model, not ``event.json()``.

The same CompleteLesson events as :mod:`examples.lessons.app` (and the same
tables). kinbox validates each value into :class:`LessonCompleted` before the
handler runs; a value that does not validate is dead-lettered at once with
reason ``payload``, the validation error in its ``kinbox.dlq.error.message``
header. Run it with ``kinbox worker examples.lessons.app_pydantic:app``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from examples.lessons.app import TOPIC
from kinbox import App, Event

app = App(group_id="progress-service")


class LessonCompleted(BaseModel):
    """The event CompleteLesson publishes (``{"userId": ..., "lessonId": ...}``)."""

    model_config = ConfigDict(alias_generator=to_camel)

    user_id: str
    lesson_id: str
    completed_at: datetime | None = None  # epoch milliseconds in the JSON


@app.handler(TOPIC)
def lesson_completed(lesson: LessonCompleted, tx: psycopg.Connection[Any], event: Event) -> None:
    """Record the user's progress; runs inside the inbox transaction."""
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id, completed_at)"
        " VALUES (%s, %s, coalesce(%s, now())) ON CONFLICT DO NOTHING",
        (lesson.user_id, lesson.lesson_id, lesson.completed_at),
    )
    tx.execute("INSERT INTO lesson_applications (event_id) VALUES (%s)", (event.id,))
