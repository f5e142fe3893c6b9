"""The README's example handler, tested with kinbox.testing the way the docs tell users to.

``examples/lessons/app.py`` is the README's ``lesson_completed`` as a runnable
service. The README's examples are ``docs_src/getting_started/app.py`` and
``docs_src/outbox/complete_lesson.py`` line for line (tests/docs runs both);
the last test runs the first with ``docs_src/testing/test_app.py`` (the docs'
"Testing your handlers") as a user's project, in a pytest of its own, so
neither can drift from what works.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from examples.lessons.app import TOPIC, app, create_tables
from kinbox.testing import InboxTestClient, Message, assert_redelivery_safe
from tests.support.userproject import child_env, run_pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
APP = ROOT / "docs_src/getting_started/app.py"
TEST_APP = ROOT / "docs_src/testing/test_app.py"
ENQUEUE = ROOT / "docs_src/outbox/complete_lesson.py"


def test_a_completed_lesson_is_applied_once_however_often_it_comes(
    inbox_client: Callable[..., InboxTestClient],
) -> None:
    client = inbox_client(app)
    with client.connect() as conn:
        create_tables(conn)

    first = client.deliver(TOPIC, {"userId": "u1", "lessonId": "l1"}, id="evt-1", key="u1")
    again = client.redeliver(first)
    republished = client.redeliver(first, new_offset=True)

    assert (first.status, again.status, republished.status) == ("applied", "duplicate", "duplicate")
    assert client.execute("SELECT user_id, lesson_id FROM lesson_progress") == [("u1", "l1")]
    # lesson_applications counts the handler's commits: one
    assert client.execute("SELECT event_id FROM lesson_applications") == [("evt-1",)]


def test_a_completion_without_a_user_is_dead_lettered_after_its_tries(
    inbox_client: Callable[..., InboxTestClient],
) -> None:
    client = inbox_client(app, max_attempts=2)
    with client.connect() as conn:
        create_tables(conn)

    result = client.deliver(TOPIC, {"lessonId": "l1"})

    assert result.dead_lettered and result.reason == "handler-error"
    assert isinstance(result.error, KeyError) and len(result.retries) == 1
    assert client.execute("SELECT count(*) FROM lesson_applications") == [(0,)]


def test_lesson_completed_is_redelivery_safe(kinbox_database_url: str) -> None:
    events = [
        Message(
            TOPIC, {"userId": f"u{i % 2}", "lessonId": f"l{i}", "completedAt": 1_700_000_000_000}
        )
        for i in range(4)
    ]

    report = assert_redelivery_safe(
        app, events, database_url=kinbox_database_url, setup=create_tables
    )

    assert report.written == ("lesson_applications", "lesson_progress")
    assert report.ignored == {
        "lesson_applications": {"applied_at": "differs between two clean runs"}
    }


def test_the_readmes_examples_are_the_tested_files_line_for_line() -> None:
    blocks: list[str] = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)

    assert blocks == [APP.read_text(), ENQUEUE.read_text()]


def test_the_docs_testing_example_passes_as_a_users_project(
    tmp_path: Path, kinbox_database_url: str
) -> None:
    files = {"app.py": APP.read_text(), "test_app.py": TEST_APP.read_text()}
    env = child_env(tmp_path, KINBOX_TEST_DATABASE_URL=kinbox_database_url)

    done = run_pytest(tmp_path, files, env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
