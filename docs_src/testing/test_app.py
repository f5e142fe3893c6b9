# test_app.py
from app import app

from kinbox.testing import Message, assert_redelivery_safe

DDL = """CREATE TABLE lesson_progress (
    user_id text, lesson_id text, PRIMARY KEY (user_id, lesson_id))"""


def test_a_redelivered_event_is_applied_once(inbox_client):
    client = inbox_client(app)  # its own schema, first on the search path
    client.execute(DDL)  # so this table is the test's own, and goes with it
    first = client.deliver("lesson-events", {"userId": "u1", "lessonId": "l1"})
    assert first.applied
    assert client.redeliver(first).duplicate  # the same record again: suppressed
    assert client.execute("SELECT user_id, lesson_id FROM lesson_progress") == [("u1", "l1")]


def test_lesson_completed_is_redelivery_safe(kinbox_database_url):
    events = [Message("lesson-events", {"userId": "u1", "lessonId": f"l{i}"}) for i in range(3)]
    assert_redelivery_safe(
        app, events, database_url=kinbox_database_url, setup=lambda conn: conn.execute(DDL)
    )
