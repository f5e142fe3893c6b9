"""kinbox.testing runs async handlers as the worker does: the async store, on the real DB."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from kinbox import App, DeadLetter, Event
from kinbox.testing import InboxTestClient, Message, RedeliveryUnsafe, assert_redelivery_safe

Client = Callable[..., InboxTestClient]
TABLE = "CREATE TABLE effects (event_id text, value text)"


def async_app() -> App:
    app = App(group_id="kit")

    @app.handler("t")
    async def handle(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        payload: dict[str, Any] = event.json()
        if "dead" in payload:
            raise DeadLetter(payload["dead"])
        if event.attempt < payload.get("fail_until", 0):
            raise RuntimeError(f"try {event.attempt} fails")
        if payload.get("outage"):
            # The server ends this backend, as a restart would: the connection is lost.
            await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        await tx.execute("INSERT INTO effects VALUES (%s, %s)", (event.id, str(payload["value"])))

    return app


def effects(client: InboxTestClient) -> list[tuple[Any, ...]]:
    return client.execute("SELECT event_id, value FROM effects ORDER BY event_id, value")


def test_async_verdicts_applied_duplicate_retried_dead_lettered(inbox_client: Client) -> None:
    client = inbox_client(async_app())
    client.execute(TABLE)

    first = client.deliver("t", {"value": "a"}, id="e1")
    again = client.redeliver(first)
    flaky = client.deliver("t", {"value": "b", "fail_until": 2}, id="e2")
    dead = client.deliver("t", {"dead": "no"}, id="e3")
    batch = client.deliver_batch(
        [Message("t", {"value": "c"}, id="e4"), Message("t", {"value": "d"}, id="e4")]
    )

    assert (first.status, again.status, flaky.status) == ("applied", "duplicate", "applied")
    assert [t.attempt for t in flaky.retries] == [1]
    assert dead.dead_lettered and (dead.reason or "").startswith("dead-letter-requested")
    assert [r.status for r in batch] == ["applied", "duplicate"]
    assert effects(client) == [("e1", "a"), ("e2", "b"), ("e4", "c")]


def test_an_async_handlers_outage_counts_no_try(inbox_client: Client) -> None:
    client = inbox_client(async_app(), outage_retries=2)
    client.execute(TABLE)

    result = client.deliver("t", {"outage": True})

    assert result.failed and result.reason is None
    assert [(t.attempt, t.kind) for t in result.retries] == [(1, "store"), (1, "store")]


def setup(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE orders (event_id text NOT NULL)")


def orders_app(database_url: str | None = None) -> App:
    """Places each order in the transaction; with ``database_url``, also outside it (a leak)."""
    app = App(group_id="orders")

    @app.handler("orders")
    async def place(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        await tx.execute("INSERT INTO orders VALUES (%s)", (event.id,))
        if database_url is not None:
            row = await (await tx.execute("SELECT current_schema()")).fetchone()
            assert row is not None
            own = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
            async with own:
                await own.execute(f'INSERT INTO "{row[0]}".orders VALUES (%s)', (event.id,))

    return app


def test_the_redelivery_check_passes_an_async_handler_and_catches_its_leak(
    kinbox_database_url: str,
) -> None:
    messages = [Message("orders", {}, id=f"o{i}") for i in range(2)]
    report = assert_redelivery_safe(
        orders_app(), messages, database_url=kinbox_database_url, setup=setup
    )
    assert report.written == ("orders",)

    with pytest.raises(RedeliveryUnsafe, match="table orders"):
        assert_redelivery_safe(
            orders_app(kinbox_database_url), messages, database_url=kinbox_database_url,
            setup=setup, scenarios=["crash"],
        )  # fmt: skip
