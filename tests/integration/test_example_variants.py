"""examples/lessons' CompleteLesson variants (pydantic, SQLAlchemy), run against the real stack.

Each variant's handler is registered as the example registers it, but on the
test's own topic, group and schema; three completions (one delivered twice)
and a broken payload go through a real worker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from types import ModuleType

import psycopg
import pytest

from examples.lessons import app_pydantic, app_sqlalchemy
from examples.lessons.app import create_tables
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import running, statuses
from tests.integration.inbox_support import committed, settings
from tests.integration.typed_support import fresh_app, produce_values
from tests.support.database import Conn
from tests.support.waiting import wait_for


@pytest.mark.parametrize("variant", [app_pydantic, app_sqlalchemy], ids=["pydantic", "sqlalchemy"])
def test_each_completion_is_applied_once_and_a_broken_payload_dead_lettered(
    variant: ModuleType, stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given the variant's handler on the test's own topic, and the example's tables
    handler: Callable[..., object] = variant.lesson_completed
    assert variant.app.topics == ["lesson-events"]
    app, topic, group = fresh_app(stack, make_topic, schema)
    app.handler(topic)(handler)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        create_tables(conn)
    user = f"u-{uuid.uuid4().hex[:8]}"

    def completion(lesson: str) -> bytes:
        payload = {"event": "lesson.completed", "userId": user, "lessonId": lesson}
        return json.dumps({**payload, "completedAt": 1_700_000_000_000}).encode()

    # ... three completions, the first delivered twice, and a broken one
    ids = [f"{user}-{n}" for n in range(3)]
    records = [(ids[0], completion("l1")), (ids[1], completion("l2")), (ids[0], completion("l1"))]
    records += [(f"{user}-broken", b'{"userId": 42}'), (ids[2], completion("l3"))]
    produce_values(stack.bootstrap_servers, topic, records)

    # When a worker consumes them
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 5})

    # Then every lesson is recorded, each completion applied once (the duplicate
    # suppressed), and the broken payload dead-lettered with reason payload
    progress = db.execute(
        "SELECT lesson_id FROM lesson_progress WHERE user_id = %s ORDER BY lesson_id", (user,)
    ).fetchall()
    assert [r[0] for r in progress] == ["l1", "l2", "l3"]
    applied = db.execute(
        "SELECT event_id FROM lesson_applications WHERE event_id LIKE %s ORDER BY event_id",
        (f"{user}-%",),
    ).fetchall()
    assert [r[0] for r in applied] == ids
    status, reason = statuses(db, schema, group)[f"{user}-broken"]
    assert status == "dead_lettered" and (reason or "").startswith("payload: InvalidPayload: ")
