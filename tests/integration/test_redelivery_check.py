"""assert_redelivery_safe against the real PostgreSQL: it passes correct handlers, catches leaks.

A leak is an effect the inbox transaction cannot take back: a write through
a connection of the handler's own, a counter kept outside the database. The
check must name the event, the fault and the table.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kinbox import App, DeadLetter, Event
from kinbox.core.errors import ConfigurationError
from kinbox.testing import SCENARIOS, Message, RedeliveryUnsafe, assert_redelivery_safe

Conn = psycopg.Connection[Any]

ORDERS = """
CREATE TABLE orders (id bigserial PRIMARY KEY, user_id text NOT NULL,
                     placed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE order_lines (id integer GENERATED ALWAYS AS IDENTITY,
                          order_id bigint NOT NULL REFERENCES orders (id), sku text NOT NULL);
CREATE TABLE audit (event_id text NOT NULL);
CREATE TABLE counters (name text PRIMARY KEY, n integer NOT NULL);
INSERT INTO counters VALUES ('orders', 0);
"""


def setup(conn: Conn) -> None:
    conn.execute(ORDERS)


def events(count: int = 3) -> list[Message]:
    return [
        Message("orders", {"user": f"u{i}", "sku": f"s{i}"}, id=f"order-{i}", key=f"u{i}")
        for i in range(count)
    ]


def leaking_app(database_url: str, statement: str, with_id: bool = False) -> App:
    """An app whose handler places the order in its transaction, and runs ``statement``
    through a connection of its own (the run's schema on its search path): that escapes."""
    app = App(group_id="orders-service")

    @app.handler("orders")
    def place(event: Event, tx: Conn) -> None:
        tx.execute("INSERT INTO orders (user_id) VALUES (%s)", (event.json()["user"],))
        row = tx.execute("SELECT current_schema()").fetchone()
        assert row is not None
        with psycopg.connect(database_url, autocommit=True) as own:
            own.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(row[0])))
            own.execute(statement, (event.id,) if with_id else None)

    return app


def test_a_correct_handler_passes_with_sequences_defaults_and_a_dead_letter(
    kinbox_database_url: str,
) -> None:
    app = App(group_id="orders-service")

    @app.handler("orders")
    def place(event: Event, tx: Conn) -> None:
        payload = event.json()
        if payload["sku"] == "gone":
            raise DeadLetter("sku withdrawn")
        row = tx.execute(
            "INSERT INTO orders (user_id) VALUES (%s) RETURNING id", (payload["user"],)
        ).fetchone()
        assert row is not None
        tx.execute(
            "INSERT INTO order_lines (order_id, sku) VALUES (%s, %s)", (row[0], payload["sku"])
        )
        tx.execute("UPDATE counters SET n = n + 1 WHERE name = 'orders'")

    withdrawn = Message("orders", {"user": "u9", "sku": "gone"}, id="order-9")
    report = assert_redelivery_safe(
        app, [*events(), withdrawn], database_url=kinbox_database_url, setup=setup
    )

    # Then three runs sufficed, every fault was injected, and the legitimately
    # different columns were left out, saying why
    assert report.runs == 3 and report.events == 4
    assert report.faults == 3 * 4  # crash, transient, lost-commit on each event
    assert report.written == ("counters", "order_lines", "orders")
    assert report.compared == ("audit", "counters", "order_lines", "orders", "processed_events")
    assert report.ignored == {
        "orders": {"id": "filled from a sequence", "placed_at": "differs between two clean runs"},
        "order_lines": {
            "id": "filled from a sequence",
            "order_id": "refers to orders.id, from a sequence",
        },
    }


def test_a_write_through_the_handlers_own_connection_is_caught_and_named(
    kinbox_database_url: str,
) -> None:
    app = leaking_app(kinbox_database_url, "INSERT INTO audit VALUES (%s)", with_id=True)

    with pytest.raises(RedeliveryUnsafe) as caught:
        assert_redelivery_safe(app, events(2), database_url=kinbox_database_url, setup=setup)

    # Then each event is blamed for the faults that run its handler twice
    # (a duplicate and a lost COMMIT answer run it once: they pass)
    blamed = Counter(
        (d.message.id if d.message else None, d.scenario) for d in caught.value.differences
    )
    assert blamed == {
        ("order-0", "crash"): 1, ("order-0", "transient"): 1,
        ("order-1", "crash"): 1, ("order-1", "transient"): 1,
    }  # fmt: skip
    first = caught.value.differences[0]
    assert first.table is not None and first.table.table == "audit"
    assert (first.table.clean, first.table.faulty) == (2, 3)
    assert first.table.extra == (("order-0",),)
    assert first.where == ("orders", 0, 0)
    message = str(caught.value)
    assert "event 'order-0' (orders[0]@0), crash: the worker killed between the handler" in message
    assert "table audit: 3 row(s), where one clean delivery of each event leaves 2" in message
    assert "only after the faults: (event_id='order-0')" in message


def test_an_update_that_escapes_is_caught_though_no_row_count_changes(
    kinbox_database_url: str,
) -> None:
    app = leaking_app(kinbox_database_url, "UPDATE counters SET n = n + 1 WHERE name = 'orders'")

    with pytest.raises(RedeliveryUnsafe) as caught:
        assert_redelivery_safe(
            app, events(1), database_url=kinbox_database_url, setup=setup, scenarios=["crash"]
        )

    (difference,) = caught.value.differences
    assert difference.table is not None and difference.table.table == "counters"
    assert difference.table.extra == (("orders", "2"),)
    assert difference.table.missing == (("orders", "1"),)
    assert "the same 1 row(s) count, different contents" in str(caught.value)


def test_state_outside_the_database_is_compared_through_observe(kinbox_database_url: str) -> None:
    sent: list[str] = []
    app = App(group_id="mailer")

    @app.handler("orders")
    def confirm(event: Event, tx: Conn) -> None:
        sent.append(f"mail to {event.json()['user']}")  # not undone by a rollback

    with pytest.raises(RedeliveryUnsafe) as caught:
        assert_redelivery_safe(
            app, events(1), database_url=kinbox_database_url,
            observe=lambda: sorted(sent), reset=sent.clear, scenarios=["transient"],
        )  # fmt: skip

    (difference,) = caught.value.differences
    assert difference.observed == (["mail to u0"], ["mail to u0", "mail to u0"])
    assert "observe() returns ['mail to u0', 'mail to u0']" in str(caught.value)


def test_only_the_chosen_scenarios_run(kinbox_database_url: str) -> None:
    app = leaking_app(kinbox_database_url, "INSERT INTO audit VALUES (%s)", with_id=True)

    # A duplicate never reaches the handler, nor does a retry after a lost
    # COMMIT answer: even a leaking handler passes these two.
    report = assert_redelivery_safe(
        app, events(2), database_url=kinbox_database_url, setup=setup,
        scenarios=["duplicate", "lost-commit"],
    )  # fmt: skip
    assert report.faults == 2 and report.written == ("audit", "orders")
    assert set(SCENARIOS) == {"duplicate", "crash", "transient", "lost-commit"}


def test_a_table_outside_the_runs_schema_cannot_be_judged(kinbox_database_url: str) -> None:
    with psycopg.connect(kinbox_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.kit_shared_log (event_id text)")
    app = App(group_id="orders-service")

    @app.handler("orders")
    def place(event: Event, tx: Conn) -> None:
        tx.execute("INSERT INTO public.kit_shared_log VALUES (%s)", (event.id,))

    try:
        with pytest.raises(ConfigurationError, match=r"writes public\.kit_shared_log, outside"):
            assert_redelivery_safe(app, events(1), database_url=kinbox_database_url)
    finally:
        with psycopg.connect(kinbox_database_url, autocommit=True) as conn:
            conn.execute("DROP TABLE public.kit_shared_log")


def test_a_handler_whose_clean_runs_differ_in_size_cannot_be_judged(
    kinbox_database_url: str,
) -> None:
    runs = itertools.count(1)
    app = App(group_id="orders-service")

    @app.handler("orders")
    def place(event: Event, tx: Conn) -> None:
        for _ in range(next(runs)):  # more rows every time: not a function of the events
            tx.execute("INSERT INTO audit VALUES (%s)", (event.id,))

    with pytest.raises(
        ConfigurationError, match=r"two clean deliveries .* table audit with 1 and 2"
    ):
        assert_redelivery_safe(app, events(1), database_url=kinbox_database_url, setup=setup)


def test_no_events_is_a_mistake(kinbox_database_url: str) -> None:
    with pytest.raises(ConfigurationError, match="needs events"):
        assert_redelivery_safe(App(group_id="g"), [], database_url=kinbox_database_url)
