from pydantic import BaseModel

from kinbox import App

app = App(group_id="progress-service")


class LessonCompleted(BaseModel):
    userId: str
    lessonId: str


@app.handler("lesson-events", batch=True)
def lessons_completed(lessons: list[LessonCompleted], tx) -> None:
    # the fresh events of one partition batch, in offset order: one statement for all
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id)"
        " SELECT * FROM unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING",
        ([x.userId for x in lessons], [x.lessonId for x in lessons]),
    )
