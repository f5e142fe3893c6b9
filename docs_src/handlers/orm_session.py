from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from kinbox import App, Event

app = App(group_id="progress-service")


class Base(DeclarativeBase):
    pass


class LessonProgress(Base):
    __tablename__ = "lesson_progress"
    user_id: Mapped[str] = mapped_column(String, primary_key=True)
    lesson_id: Mapped[str] = mapped_column(String, primary_key=True)


class LessonCompleted(BaseModel):
    userId: str
    lessonId: str


@app.handler("lesson-events")
def lesson_completed(lesson: LessonCompleted, session: Session, event: Event) -> None:
    # the session runs on the inbox transaction's connection: this commits with the claim
    if session.get(LessonProgress, (lesson.userId, lesson.lessonId)) is None:
        session.add(LessonProgress(user_id=lesson.userId, lesson_id=lesson.lessonId))
