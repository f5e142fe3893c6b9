import dataclasses

from kinbox import App

app = App(group_id="progress-service")


@dataclasses.dataclass
class LessonCompleted:  # built from the JSON object's keys; no pydantic needed
    userId: str
    lessonId: str
    completedAt: int | None = None


@app.handler("lesson-events")
def lesson_completed(lesson: LessonCompleted, tx) -> None:
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (lesson.userId, lesson.lessonId),
    )
