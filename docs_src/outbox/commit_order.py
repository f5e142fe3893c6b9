import uuid

import psycopg

from producer_outbox import enqueue


def rename_user(conn: psycopg.Connection, user_id: str, name: str) -> uuid.UUID:
    with conn.transaction():
        # first statement: lock the aggregate, so the outbox publishes this key in commit order
        conn.execute("SELECT 1 FROM users WHERE id = %s FOR UPDATE", (user_id,))
        conn.execute("UPDATE users SET name = %s WHERE id = %s", (name, user_id))
        return enqueue(conn, "user-events", {"userId": user_id, "name": name}, key=user_id)
