# app.py
from kinbox import App, Event

app = App(group_id="progress-service")


@app.handler("lesson-events")
def lesson_completed(event: Event, tx) -> None:  # tx: psycopg.Connection, inside the transaction
    p = event.json()
    tx.execute(
        "INSERT INTO lesson_progress (user_id, lesson_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (p["userId"], p["lessonId"]),
    )
