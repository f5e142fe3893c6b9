import uuid

import psycopg

from producer_outbox import enqueue


def complete_lesson(conn: psycopg.Connection, user_id: str, lesson_id: str) -> uuid.UUID:
    with conn.transaction():
        conn.execute(
            "INSERT INTO lesson_completions (user_id, lesson_id) VALUES (%s, %s)",
            (user_id, lesson_id),
        )
        # same transaction: a rollback publishes nothing, a commit publishes at least once
        return enqueue(
            conn, "lesson-events", {"userId": user_id, "lessonId": lesson_id}, key=user_id
        )
