"""The progress service's handler as an ``async def`` on SQLAlchemy: an ``AsyncSession``.

The ORM models and payload of :mod:`examples.lessons.app_sqlalchemy`; the
handler asks for an ``AsyncSession`` and gets one bound to the inbox
transaction, over the ``AsyncConnection`` kinbox holds: what it adds commits
with the event's claim, or not at all. Run it with
``kinbox worker examples.lessons.app_async_sqlalchemy:app``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from examples.lessons.app import TOPIC
from examples.lessons.app_sqlalchemy import LessonApplication, LessonCompleted, LessonProgress
from kinbox import App, Event

app = App(group_id="progress-service")


@app.handler(TOPIC)
async def lesson_completed(lesson: LessonCompleted, session: AsyncSession, event: Event) -> None:
    """Record the user's progress through the ORM; runs inside the inbox transaction."""
    if await session.get(LessonProgress, (lesson.userId, lesson.lessonId)) is None:
        when = (
            datetime.fromtimestamp(lesson.completedAt / 1000, UTC)
            if lesson.completedAt is not None
            else datetime.now(UTC)
        )
        session.add(
            LessonProgress(user_id=lesson.userId, lesson_id=lesson.lessonId, completed_at=when)
        )
    session.add(LessonApplication(event_id=event.id))
