"""examples/lessons/app_sqlalchemy.py: CompleteLesson through the ORM, applied once."""

from __future__ import annotations

from examples.lessons import app_sqlalchemy
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.example_variants import run_variant
from tests.integration.failure_support import statuses
from tests.integration.inbox_support import Conn


def test_the_sqlalchemy_variant_applies_each_completion_once(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    group, applied = run_variant(app_sqlalchemy.lesson_completed, stack, make_topic, schema, db)
    assert len(applied) == 3 and len(set(applied)) == 3  # the duplicate was suppressed
    broken = next(v for k, v in statuses(db, schema, group).items() if k.endswith("-broken"))
    assert (broken[1] or "").startswith("payload: InvalidPayload: ")
    assert app_sqlalchemy.app.topics == ["lesson-events"]
