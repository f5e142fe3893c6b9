# check.py: what the handler wrote
import os

import psycopg

with psycopg.connect(os.environ["KINBOX_DATABASE_URL"]) as conn:
    print(conn.execute("SELECT user_id, lesson_id FROM lesson_progress").fetchall())
