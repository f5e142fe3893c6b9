"""Every handler and outbox example of the docs, run on a real PostgreSQL through kinbox.testing.

The pages include these files from docs_src/ as they are, so an example that
stops working fails here, not in a reader's hands.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from kinbox import App
from kinbox.testing import InboxTestClient, Message

pytestmark = pytest.mark.integration

PROGRESS = (
    "CREATE TABLE lesson_progress (user_id text, lesson_id text, PRIMARY KEY (user_id, lesson_id))"
)
COMPLETIONS = "CREATE TABLE lesson_completions (user_id text, lesson_id text)"
Client = Callable[..., InboxTestClient]


@pytest.fixture
def outbox_client(kinbox_database_url: str) -> Iterator[Client]:
    """A client in the schema ``kinbox``, with the outbox: where ``enqueue`` writes by default."""
    drop = "DROP SCHEMA IF EXISTS kinbox CASCADE"
    clients: list[InboxTestClient] = []

    def make(app: App) -> InboxTestClient:
        with psycopg.connect(kinbox_database_url, autocommit=True) as conn:
            conn.execute(drop)
        clients.append(InboxTestClient(app, kinbox_database_url, schema="kinbox", outbox=True))
        return clients[-1]

    yield make
    for client in clients:
        client.close()
    with psycopg.connect(kinbox_database_url, autocommit=True) as conn:
        conn.execute(drop)


def app_of(module: str) -> App:
    app = importlib.import_module(f"docs_src.{module}").app
    assert isinstance(app, App)
    return app


@pytest.mark.parametrize(
    "module",
    [
        "getting_started.app",
        "handlers.typed",
        "handlers.dataclass_payload",
        "handlers.async_handler",
        "handlers.orm_session",
    ],
)
def test_a_per_event_handler_applies_a_lesson_once(inbox_client: Client, module: str) -> None:
    client = inbox_client(app_of(module))
    client.execute(PROGRESS)

    first = client.deliver("lesson-events", {"userId": "u1", "lessonId": "l1"}, key="u1")
    again = client.redeliver(first)

    assert (first.status, again.status) == ("applied", "duplicate")
    assert client.execute("SELECT user_id, lesson_id FROM lesson_progress") == [("u1", "l1")]


def test_a_payload_that_does_not_validate_is_dead_lettered_at_once(inbox_client: Client) -> None:
    client = inbox_client(app_of("handlers.typed"))
    client.execute(PROGRESS)

    result = client.deliver("lesson-events", {"userId": "u1"})

    assert result.dead_lettered and result.reason == "payload" and not result.retries


def test_the_batch_handler_writes_a_partition_batch_with_one_statement(
    inbox_client: Client,
) -> None:
    client = inbox_client(app_of("handlers.batch"))
    client.execute(PROGRESS)
    messages = [Message("lesson-events", {"userId": "u1", "lessonId": f"l{i}"}) for i in range(5)]

    results = client.deliver_batch([*messages, messages[0]])  # a repeated id in the same poll

    assert [r.status for r in results].count("applied") == 5
    assert client.execute("SELECT count(*) FROM lesson_progress") == [(5,)]


def test_the_key_ordered_handler_keeps_each_skus_orders_in_order(inbox_client: Client) -> None:
    client = inbox_client(app_of("handlers.key_order"))
    client.execute("CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL DEFAULT 0)")
    client.execute("INSERT INTO stock (sku) VALUES ('s1'), ('s2'), ('s3')")
    client.execute("CREATE TABLE reservations (seq serial, sku text, order_id text)")
    orders = [(f"o{n}", f"s{n % 3 + 1}") for n in range(12)]
    messages = [
        Message("orders", {"id": o, "sku": sku, "qty": 1}, key=sku, partition=0)
        for o, sku in orders
    ]

    results = client.deliver_batch([*messages, messages[0]])  # one order delivered twice

    assert [r.status for r in results].count("applied") == 12
    assert client.execute("SELECT sku, reserved FROM stock ORDER BY sku") == [
        ("s1", 4),
        ("s2", 4),
        ("s3", 4),
    ]
    for sku in ("s1", "s2", "s3"):
        applied = client.execute(
            "SELECT order_id FROM reservations WHERE sku = %s ORDER BY seq", (sku,)
        )
        assert [row[0] for row in applied] == [o for o, s in orders if s == sku]


def test_the_schema_registry_handler_registers_with_its_deserializer() -> None:
    app = app_of("handlers.schema_registry")

    assert app.topics == ["orders"]


def test_caused_by_links_each_enqueued_row_to_its_event(outbox_client: Client) -> None:
    client = outbox_client(app_of("handlers.caused_by"))

    results = client.deliver_batch(
        [Message("orders", {"orderId": f"o{i}"}, id=f"evt-{i}") for i in range(2)]
    )

    assert [r.status for r in results] == ["applied", "applied"]
    rows = client.execute(
        "SELECT caused_by_event_id, payload->>'orderId' FROM kinbox.outbox ORDER BY 2"
    )
    assert rows == [("evt-0", "o0"), ("evt-1", "o1")]


def test_a_parking_handler_holds_an_accounts_later_postings_behind_its_dead_letter(
    inbox_client: Client,
) -> None:
    client = inbox_client(app_of("failures.park_keys"))
    client.execute("CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL)")
    client.execute("INSERT INTO accounts VALUES ('a2', 0)")
    postings = [("a1", 10), ("a2", 5), ("a1", -3), ("a2", 1)]  # account a1 does not exist yet
    messages = [
        Message("postings", {"account": a, "amount": n}, key=a, partition=0) for a, n in postings
    ]

    results = client.deliver_batch(messages)

    assert [r.status for r in results] == ["dead_lettered", "applied", "parked", "applied"]
    assert client.execute("SELECT id, balance FROM accounts") == [("a2", 6)]


def test_dead_letter_and_retry_are_verdicts_the_handler_gives(inbox_client: Client) -> None:
    client = inbox_client(app_of("failures.verdicts"))
    client.execute(PROGRESS)
    client.execute("CREATE TABLE lessons (id text PRIMARY KEY, active boolean)")
    client.execute("INSERT INTO lessons VALUES ('l1', true), ('l2', false)")

    missing = client.deliver("lesson-events", {"userId": "u1", "lessonId": "nope"})
    unpublished = client.deliver("lesson-events", {"userId": "u1", "lessonId": "l2"})
    fine = client.deliver("lesson-events", {"userId": "u1", "lessonId": "l1"})

    assert missing.dead_lettered and not missing.retries
    assert missing.reason is not None and "no such lesson" in missing.reason
    assert unpublished.dead_lettered and len(unpublished.retries) == 2  # max_attempts=3
    assert fine.applied


def test_a_savepoint_of_its_own_lets_a_handler_go_on_after_a_refused_statement(
    inbox_client: Client,
) -> None:
    client = inbox_client(app_of("failures.savepoint"))
    client.execute(PROGRESS)
    client.execute("CREATE TABLE lesson_log (event_id text)")
    client.execute("INSERT INTO lesson_progress VALUES ('u1', 'l1')")

    result = client.deliver("lesson-events", {"userId": "u1", "lessonId": "l1"}, id="evt-1")

    assert result.applied
    assert client.execute("SELECT event_id FROM lesson_log") == [("evt-1",)]


def test_enqueue_writes_the_event_in_the_business_transaction(outbox_client: Client) -> None:
    from docs_src.outbox.complete_lesson import complete_lesson

    client = outbox_client(app_of("getting_started.app"))
    client.execute(COMPLETIONS)
    with psycopg.connect(client.conninfo) as conn:
        event_id = complete_lesson(conn, "u1", "l1")
        with pytest.raises(ZeroDivisionError), conn.transaction():
            complete_lesson(conn, "u2", "l2")  # a savepoint of the outer transaction
            raise ZeroDivisionError  # the outer one rolls back: the event goes with it

    rows = client.execute("SELECT id, aggregateid FROM kinbox.outbox")
    assert rows == [(event_id, "u1")]


def test_enqueue_async_writes_the_same_row(outbox_client: Client) -> None:
    from docs_src.outbox.complete_lesson_async import complete_lesson

    client = outbox_client(app_of("getting_started.app"))
    client.execute(COMPLETIONS)

    async def run() -> Any:
        async with await psycopg.AsyncConnection.connect(client.conninfo) as conn:
            return await complete_lesson(conn, "u1", "l1")

    event_id = asyncio.run(run())

    assert client.execute("SELECT id FROM kinbox.outbox") == [(event_id,)]


def test_the_commit_order_example_locks_the_aggregate_first(outbox_client: Client) -> None:
    from docs_src.outbox.commit_order import rename_user

    client = outbox_client(app_of("getting_started.app"))
    client.execute("CREATE TABLE users (id text PRIMARY KEY, name text)")
    client.execute("INSERT INTO users VALUES ('u1', 'Ada')")
    with psycopg.connect(client.conninfo) as conn:
        rename_user(conn, "u1", "Grace")

    assert client.execute("SELECT name FROM users") == [("Grace",)]
    assert client.execute("SELECT aggregateid FROM kinbox.outbox") == [("u1",)]
