"""pytest fixtures for testing kinbox handlers on a real PostgreSQL: registered on install.

``pip install kinbox`` registers this module as a pytest plugin (the
``pytest11`` entry point ``kinbox``), so a test suite gets, without a
``conftest.py``:

``kinbox_database_url`` (session)
    the URL of a PostgreSQL server: ``KINBOX_TEST_DATABASE_URL`` if set
    (a CI service container, a shared test server), else a throwaway
    private server started by kinbox's own launcher
    (:class:`~kinbox.devstack.postgres.PostgresServer`: needs the server
    binaries, Debian's ``postgresql-15`` or ``KINBOX_PG_BINDIR``), stopped
    and removed when the session ends. When it cannot start, the tests
    that need it fail under ``CI=true`` and are skipped otherwise.
``inbox_client`` (function)
    a factory: ``inbox_client(app, **options)`` returns an
    :class:`~kinbox.testing.InboxTestClient` on that server, in a schema of
    its own, closed (and the schema dropped) after the test.

Nothing happens until a test asks for a fixture: the plugin has no hooks,
and importing it loads neither psycopg nor the launcher, so suites that do
not use it are neither slowed down nor changed. A fixture of the same name in
a ``conftest.py`` overrides these as usual; ``-p no:kinbox`` turns the plugin
off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from kinbox.app import App
    from kinbox.testing.client import InboxTestClient

DATABASE_ENV = "KINBOX_TEST_DATABASE_URL"
"""The environment variable naming an existing server to test against."""


@pytest.fixture(scope="session")
def kinbox_database_url() -> Iterator[str]:
    """A PostgreSQL URL for the session: ``KINBOX_TEST_DATABASE_URL``, or a throwaway server."""
    external = os.environ.get(DATABASE_ENV)
    if external:
        yield external
        return
    from kinbox.core.errors import ServiceError
    from kinbox.devstack.postgres import PostgresServer

    try:
        server = PostgresServer()
    except ServiceError as exc:
        _unavailable(exc)
    try:
        server.start()
    except ServiceError as exc:
        server.close()
        _unavailable(exc)
    try:
        yield server.url
    finally:
        server.close()


def _unavailable(exc: Exception) -> NoReturn:
    """No server: a failure under ``CI=true`` (never a skip there), a skip elsewhere."""
    message = (
        f"kinbox: no PostgreSQL for the tests (set {DATABASE_ENV}, or install the server): {exc}"
    )
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message + " (CI: a failure, not a skip)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def inbox_client(kinbox_database_url: str) -> Iterator[Callable[..., InboxTestClient]]:
    """``inbox_client(app, **options)``: an InboxTestClient, closed after the test."""
    from kinbox.testing.client import InboxTestClient

    made: list[InboxTestClient] = []

    def make(app: App, **options: Any) -> InboxTestClient:
        client = InboxTestClient(app, kinbox_database_url, **options)
        made.append(client)
        return client

    yield make
    for client in reversed(made):
        client.close()
