"""The progress service's handler on SQLAlchemy: ORM models and a Session in the inbox transaction.

The same CompleteLesson events and tables as :mod:`examples.lessons.app`. The
handler asks for a ``Session`` and gets one bound to the inbox transaction:
what it adds commits together with the event's claim, or not at all, and a
redelivered event never reaches it. ``session.commit()`` would be harmless
here (it only releases the session's savepoint); kinbox commits. The payload
is a plain dataclass (no pydantic needed): its fields are the JSON's keys.
Run it with ``kinbox worker examples.lessons.app_sqlalchemy:app``.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from sqlalchemy import DateTime, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from examples.lessons.app import TOPIC
from kinbox import App, Event

app = App(group_id="progress-service")


class Base(DeclarativeBase):
    """The service's ORM models."""


class LessonProgress(Base):
    """One row per (user, lesson) completed."""

    __tablename__ = "lesson_progress"
    user_id: Mapped[str] = mapped_column(String, primary_key=True)
    lesson_id: Mapped[str] = mapped_column(String, primary_key=True)
    completed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LessonApplication(Base):
    """Every time the handler's work committed (a duplicate application would show here)."""

    __tablename__ = "lesson_applications"
    # The table has no key (so that a duplicate could be seen); the ORM needs
    # one to track the rows it adds, and the event id is what identifies one.
    event_id: Mapped[str] = mapped_column(String, primary_key=True)
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


@dataclasses.dataclass
class LessonCompleted:
    """The event CompleteLesson publishes, field for field."""

    userId: str  # the JSON's own keys, as they are
    lessonId: str
    completedAt: int | None = None  # epoch milliseconds


@app.handler(TOPIC)
def lesson_completed(lesson: LessonCompleted, session: Session, event: Event) -> None:
    """Record the user's progress through the ORM; runs inside the inbox transaction."""
    if session.get(LessonProgress, (lesson.userId, lesson.lessonId)) is None:
        when = (
            datetime.fromtimestamp(lesson.completedAt / 1000, UTC)
            if lesson.completedAt is not None
            else datetime.now(UTC)
        )
        progress = LessonProgress(
            user_id=lesson.userId, lesson_id=lesson.lessonId, completed_at=when
        )
        session.add(progress)
    session.add(LessonApplication(event_id=event.id))
