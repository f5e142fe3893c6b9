from pydantic import BaseModel  # pip install 'kinbox[pydantic]'

from kinbox import App, Event

app = App(group_id="progress-service")


class LessonCompleted(BaseModel):
    userId: str
    lessonId: str


@app.handler("lesson-events")
def lesson_completed(lesson: LessonCompleted, tx, event: Event) -> None:  # event: optional
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (lesson.userId, lesson.lessonId),
    )
