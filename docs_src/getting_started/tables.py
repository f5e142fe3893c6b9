# tables.py: the table the handler writes, in the database of KINBOX_DATABASE_URL
import os

import psycopg

with psycopg.connect(os.environ["KINBOX_DATABASE_URL"]) as conn:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS lesson_progress"
        " (user_id text, lesson_id text, PRIMARY KEY (user_id, lesson_id))"
    )
