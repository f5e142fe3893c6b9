from psycopg import AsyncConnection
from pydantic import BaseModel

from kinbox import App, Event

app = App(group_id="progress-service")


class LessonCompleted(BaseModel):
    userId: str
    lessonId: str


@app.handler("lesson-events")
async def lesson_completed(lesson: LessonCompleted, tx: AsyncConnection, event: Event) -> None:
    await tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (lesson.userId, lesson.lessonId),
    )
