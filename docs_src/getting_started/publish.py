# publish.py: a business transaction that also writes its event into the outbox
import os

import psycopg

from producer_outbox import enqueue

with psycopg.connect(os.environ["KINBOX_DATABASE_URL"]) as conn:
    with conn.transaction():
        # ... your own writes here, in the same transaction ...
        event_id = enqueue(conn, "lesson-events", {"userId": "u1", "lessonId": "l1"}, key="u1")
    print(f"enqueued {event_id}")
