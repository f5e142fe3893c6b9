from psycopg import errors

from kinbox import App, Event

app = App(group_id="progress-service")


@app.handler("lesson-events")
def lesson_completed(event: Event, tx) -> None:
    p = event.json()
    try:
        with tx.transaction():  # a savepoint of your own: a refused statement undoes only it
            tx.execute(
                "INSERT INTO lesson_progress (user_id, lesson_id) VALUES (%s, %s)",
                (p["userId"], p["lessonId"]),
            )
    except errors.UniqueViolation:
        pass  # already there: the transaction is still usable, and commits with the claim
    tx.execute("INSERT INTO lesson_log (event_id) VALUES (%s)", (event.id,))
