"""The pytest plugin as a user's suite meets it: a separate pytest run in a project of its own.

Each test writes a small test suite into a temporary directory and runs
pytest on it in a child process (:mod:`tests.support.userproject`).
"""

from __future__ import annotations

from pathlib import Path

from kinbox.devstack.process import port_open
from tests.support.userproject import child_env, run_pytest

USERS_SUITE = """
import os

from kinbox import App, Event
from kinbox.testing import Message, assert_redelivery_safe

app = App(group_id="users-service")


@app.handler("signups")
def signed_up(event: Event, tx) -> None:
    tx.execute("INSERT INTO users (id) VALUES (%s) ON CONFLICT DO NOTHING", (event.json()["id"],))


def test_a_signup_applies_once(inbox_client, kinbox_database_url):
    client = inbox_client(app)
    client.execute("CREATE TABLE users (id text PRIMARY KEY)")
    first = client.deliver("signups", {"id": "u1"})
    assert first.applied and client.redeliver(first).duplicate
    assert client.execute("SELECT id FROM users") == [("u1",)]
    with open(os.environ["URL_FILE"], "w") as out:
        out.write(kinbox_database_url)


def test_the_handler_is_redelivery_safe(kinbox_database_url):
    assert_redelivery_safe(
        app, [Message("signups", {"id": "u2"})], database_url=kinbox_database_url,
        setup=lambda conn: conn.execute("CREATE TABLE users (id text PRIMARY KEY)"),
    )
"""


def test_a_users_suite_runs_against_the_server_it_names(
    tmp_path: Path, kinbox_database_url: str
) -> None:
    env = child_env(tmp_path, KINBOX_TEST_DATABASE_URL=kinbox_database_url)

    done = run_pytest(tmp_path, {"test_users.py": USERS_SUITE}, env)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert (tmp_path / "url").read_text() == kinbox_database_url


def test_without_a_server_named_the_plugin_starts_one_and_stops_it(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, {"test_users.py": USERS_SUITE}, child_env(tmp_path))

    assert done.returncode == 0, done.stdout + done.stderr
    url = (tmp_path / "url").read_text()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert url.startswith("postgresql://postgres@127.0.0.1:")
    assert not port_open(port)  # stopped with the session


def test_a_suite_using_no_fixture_loads_no_driver_and_starts_nothing(tmp_path: Path) -> None:
    suite = """
    import sys

    def test_nothing_heavy_was_loaded():
        loaded = {"psycopg", "kinbox.devstack.postgres", "kinbox.testing.client"} & set(sys.modules)
        assert loaded == set()
    """

    done = run_pytest(tmp_path, {"test_users.py": suite}, child_env(tmp_path))
    fixtures = run_pytest(tmp_path, {"test_users.py": suite}, child_env(tmp_path), "--fixtures")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "kinbox_database_url [session scope]" in fixtures.stdout
    assert "inbox_client" in fixtures.stdout
