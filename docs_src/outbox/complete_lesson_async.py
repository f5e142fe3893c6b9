import uuid

import psycopg

from producer_outbox import enqueue_async


async def complete_lesson(conn: psycopg.AsyncConnection, user_id: str, lesson_id: str) -> uuid.UUID:
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO lesson_completions (user_id, lesson_id) VALUES (%s, %s)",
            (user_id, lesson_id),
        )
        payload = {"userId": user_id, "lessonId": lesson_id}
        return await enqueue_async(conn, "lesson-events", payload, key=user_id)
