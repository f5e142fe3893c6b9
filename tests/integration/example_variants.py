"""Running one CompleteLesson handler variant (examples/lessons) against the real stack."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import psycopg

from examples.lessons.app import create_tables
from kinbox.app import App
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import running, statuses
from tests.integration.inbox_support import Conn, committed, prepare_schema, settings, wait_for
from tests.integration.typed_support import produce_values


def run_variant(
    handler: Callable[..., object], stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> tuple[str, list[str]]:
    """Deliver three completions (one twice) and a broken one to ``handler``; return its effects.

    The handler is registered as the example registers it, on the test's own
    topic, group and schema. Returns the group and the event ids recorded in
    ``lesson_applications`` for this run's users.
    """
    topic = make_topic(partitions=1)
    group = f"progress-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        create_tables(conn)
    user = f"u-{uuid.uuid4().hex[:8]}"
    app = App(group_id=group, schema=schema)
    app.handler(topic)(handler)

    def completion(lesson: str) -> bytes:
        payload = {"event": "lesson.completed", "userId": user, "lessonId": lesson}
        return json.dumps({**payload, "completedAt": 1_700_000_000_000}).encode()

    ids = [f"{user}-{n}" for n in range(3)]
    records = [(ids[0], completion("l1")), (ids[1], completion("l2")), (ids[0], completion("l1"))]
    records += [(f"{user}-broken", b'{"userId": 42}'), (ids[2], completion("l3"))]
    produce_values(stack.bootstrap_servers, topic, records)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 5})

    progress = db.execute(
        "SELECT lesson_id FROM lesson_progress WHERE user_id = %s ORDER BY lesson_id", (user,)
    ).fetchall()
    assert [r[0] for r in progress] == ["l1", "l2", "l3"]
    assert statuses(db, schema, group)[f"{user}-broken"][0] == "dead_lettered"
    applied = db.execute(
        "SELECT event_id FROM lesson_applications WHERE event_id LIKE %s ORDER BY event_id",
        (f"{user}-%",),
    ).fetchall()
    return group, [r[0] for r in applied]
