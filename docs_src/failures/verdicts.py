from pydantic import BaseModel

from kinbox import App, DeadLetter, Retry

app = App(group_id="progress-service")


class LessonCompleted(BaseModel):
    userId: str
    lessonId: str


@app.handler("lesson-events", max_attempts=3)  # default 5: --max-attempts, KINBOX_MAX_ATTEMPTS
def lesson_completed(lesson: LessonCompleted, tx) -> None:
    row = tx.execute("SELECT active FROM lessons WHERE id = %s", (lesson.lessonId,)).fetchone()
    if row is None:
        raise DeadLetter(f"no such lesson: {lesson.lessonId}")  # a verdict: at once, no retry
    if not row[0]:
        raise Retry(delay=5.0, reason="lesson not published yet")  # again in 5 s, a try counted
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (lesson.userId, lesson.lessonId),
    )
