"""kinbox.testing's InboxTestClient against the real PostgreSQL: the verdicts a user asserts on.

Every test uses the pytest plugin's own fixtures (``inbox_client``,
``kinbox_database_url``), as a user's suite would.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kinbox import App, DeadLetter, Event, Middleware, Retry
from kinbox.core.errors import ConfigurationError, EnvelopeError
from kinbox.testing import InboxTestClient, Message
from producer_outbox import enqueue

Client = Callable[..., InboxTestClient]
TABLE = "CREATE TABLE effects (event_id text, value text)"


def recording_app(**settings: Any) -> App:
    """An app whose handler of ``t`` records each payload, and obeys what the payload asks."""
    app = App(group_id="kit", **settings)

    @app.handler("t")
    def handle(event: Event, tx: psycopg.Connection[Any]) -> None:
        payload: dict[str, Any] = event.json()
        if "dead" in payload:
            raise DeadLetter(payload["dead"])
        if event.attempt < payload.get("fail_until", 0):
            raise RuntimeError(f"try {event.attempt} fails")
        if "retry" in payload:
            raise Retry(payload["retry"])
        if payload.get("outage"):
            # The server ends this backend, as a restart would: the connection is lost.
            tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        tx.execute("INSERT INTO effects VALUES (%s, %s)", (event.id, str(payload.get("value"))))

    return app


def effects(client: InboxTestClient) -> list[tuple[Any, ...]]:
    return client.execute("SELECT event_id, value FROM effects ORDER BY event_id, value")


def test_an_id_reused_with_another_payload_is_a_reported_duplicate(inbox_client: Client) -> None:
    client = inbox_client(recording_app())
    client.execute(TABLE)

    first = client.deliver("t", {"value": "a"}, id="e1")
    same = client.redeliver(first, new_offset=True)
    other = client.deliver("t", {"value": "b"}, id="e1")

    assert (first.status, same.status, other.status) == ("applied", "duplicate", "duplicate")
    assert (first.reused, same.reused, other.reused) == (False, False, True)
    assert effects(client) == [("e1", "a")]
    rows = client.execute('SELECT event_id, "offset", first_offset FROM reused_event_ids')
    assert rows == [("e1", other.record.offset, first.record.offset)]


def test_a_redelivery_and_a_republished_duplicate_are_suppressed(inbox_client: Client) -> None:
    client = inbox_client(recording_app())
    client.execute(TABLE)

    first = client.deliver("t", {"value": "a"}, id="e1")
    again = client.redeliver(first)
    republished = client.redeliver(first, new_offset=True)

    assert (first.status, again.status, republished.status) == ("applied", "duplicate", "duplicate")
    assert first.applied and again.duplicate and not first.retried
    assert (first.record.offset, again.record.offset, republished.record.offset) == (0, 0, 1)
    assert first.event_id == again.event_id == republished.event_id == "e1"
    assert effects(client) == [("e1", "a")]
    assert client.processed_events() == {"e1": "applied"}
    assert client.results == [first, again, republished]


def test_a_batch_claims_the_first_of_an_id_and_drops_the_repeat(inbox_client: Client) -> None:
    client = inbox_client(recording_app())
    client.execute(TABLE)

    results = client.deliver_batch(
        [Message("t", {"value": "x"}, id="e1"), Message("t", {"value": "y"}, id="e1"),
         Message("t", {"value": "z"}, id="e2")]
    )  # fmt: skip

    assert [r.status for r in results] == ["applied", "duplicate", "applied"]
    assert [r.record.offset for r in results] == [0, 1, 2]
    assert [r.reused for r in results] == [False, True, False]  # y is not x
    assert effects(client) == [("e1", "x"), ("e2", "z")]


def test_partitions_follow_the_key_and_offsets_grow_per_partition(inbox_client: Client) -> None:
    client = inbox_client(recording_app(), partitions=4)
    client.execute(TABLE)

    keyed = [client.deliver("t", {"value": i}, key=f"user-{i % 3}") for i in range(9)]
    pinned = client.deliver("t", {"value": "p"}, partition=3)

    by_key: dict[bytes | None, set[int]] = {}
    for result in keyed:
        by_key.setdefault(result.record.key, set()).add(result.record.partition)
    assert all(len(partitions) == 1 for partitions in by_key.values())
    offsets: dict[int, list[int]] = {}
    for result in [*keyed, pinned]:
        offsets.setdefault(result.record.partition, []).append(result.record.offset)
    assert all(found == list(range(len(found))) for found in offsets.values())
    assert pinned.record.partition == 3
    with pytest.raises(ValueError, match=r"partitions 0\.\.3"):
        client.deliver("t", {}, partition=4)


@dataclasses.dataclass
class Lesson:
    value: str


def test_payloads_may_be_bytes_text_json_objects_or_dataclasses(inbox_client: Client) -> None:
    seen: list[bytes] = []
    app = App(group_id="kit")

    @app.handler("t")
    def handle(event: Event, tx: object) -> None:
        seen.append(event.value)

    client = inbox_client(app)
    for payload in (b"\x00raw", "text é", {"value": [1, 2]}, Lesson("v"), None):
        assert client.deliver("t", payload).applied

    assert seen == [b"\x00raw", "text é".encode(), b'{"value": [1, 2]}', b'{"value": "v"}', b""]


def test_dead_letter_requested_goes_at_once_with_its_reason(inbox_client: Client) -> None:
    client = inbox_client(recording_app())
    client.execute(TABLE)

    result = client.deliver(
        "t", {"dead": "unknown lesson"}, id="e1", key="k", headers={"raw": b"\xff"}
    )

    assert result.dead_lettered and not result.retried
    assert result.reason == "dead-letter-requested: unknown lesson"
    assert isinstance(result.error, DeadLetter)
    assert result.dead_letter is not None and result.dead_letter.topic == "t.dlq"
    assert result.dead_letter.key == b"k"
    headers = result.dead_letter_headers
    assert headers["kinbox.dlq.offset"] == "0" and headers["kinbox.dlq.attempts"] == "1"
    assert client.dead_letters == [result.dead_letter]
    assert client.processed_events() == {"e1": "dead_lettered"}
    assert effects(client) == []


def test_a_failing_handler_is_retried_up_to_max_attempts_then_dead_lettered(
    inbox_client: Client,
) -> None:
    client = inbox_client(recording_app(max_attempts=3))
    client.execute(TABLE)

    flaky = client.deliver("t", {"fail_until": 3, "value": "ok"}, id="flaky")
    broken = client.deliver("t", {"fail_until": 99}, id="broken")

    # Given a handler failing on tries 1 and 2, then it is applied on try 3, once
    assert flaky.applied and [t.attempt for t in flaky.retries] == [1, 2]
    assert {t.kind for t in flaky.retries} == {"handler"}
    assert all(t.delay > 0 for t in flaky.retries)  # what the worker would wait
    assert effects(client) == [("flaky", "ok")]
    # Given a handler failing every time, then its third try dead-letters it
    assert broken.dead_lettered and broken.reason == "handler-error"
    assert [t.attempt for t in broken.retries] == [1, 2]
    assert isinstance(broken.error, RuntimeError) and str(broken.error) == "try 3 fails"
    assert broken.dead_letter_headers["kinbox.dlq.attempts"] == "3"


def test_retry_waits_what_the_handler_asked_and_runs_out_after_max_attempts(
    inbox_client: Client,
) -> None:
    client = inbox_client(recording_app(), max_attempts=2)

    result = client.deliver("t", {"retry": 7.5})

    assert [(t.attempt, t.delay) for t in result.retries] == [(1, 7.5)]
    assert result.dead_lettered and result.reason == "retries-exhausted"


def test_a_record_without_an_id_follows_the_missing_id_policy(inbox_client: Client) -> None:
    dead = inbox_client(recording_app())
    dead.execute(TABLE)
    derived = inbox_client(recording_app(), missing_id="derive")
    derived.execute(TABLE)
    failing = inbox_client(recording_app(), missing_id="fail")

    lettered = dead.deliver("t", {"value": "a"}, id=None)
    applied = derived.deliver("t", {"value": "b"}, id=None)
    stopped = failing.deliver("t", {"value": "c"}, id=None)

    assert lettered.dead_lettered and lettered.reason == "invalid-id"
    assert lettered.event_id == "t/0/0"
    assert applied.applied and effects(derived) == [("t/0/0", "b")]
    assert stopped.failed and isinstance(stopped.error, EnvelopeError)


def test_an_outage_counts_no_try_and_is_reported_failed_after_outage_retries(
    inbox_client: Client,
) -> None:
    client = inbox_client(recording_app(), outage_retries=2)
    client.execute(TABLE)

    result = client.deliver("t", {"outage": True})
    after = client.deliver("t", {"value": "next"}, id="next")

    assert result.failed and result.reason is None
    assert [(t.attempt, t.kind) for t in result.retries] == [(1, "store"), (1, "store")]
    assert client.processed_events() == {"next": "applied"}
    assert after.applied


def test_a_batch_handler_and_middleware_run_as_in_the_worker(inbox_client: Client) -> None:
    calls: list[str] = []

    class Around(Middleware):
        def around_events(
            self, events: Sequence[Event], call: Callable[[Sequence[Event]], object]
        ) -> object:
            calls.append(f"around {len(events)}")
            return call(events)

    app = App(group_id="kit", middleware=[Around()])

    @app.handler("t", batch=True)
    def handle(events: list[Event], tx: psycopg.Connection[Any]) -> None:
        calls.append(",".join(e.id for e in events))

    client = inbox_client(app)
    results = client.deliver_batch(
        [Message("t", id="a"), Message("t", id="b"), Message("t", id="a")]
    )

    assert [r.status for r in results] == ["applied", "applied", "duplicate"]
    assert calls == ["around 2", "a,b"]


def test_each_client_has_its_own_schema_and_drops_it_on_close(
    kinbox_database_url: str, inbox_client: Client
) -> None:
    one, two = inbox_client(recording_app()), inbox_client(recording_app())
    one.execute(TABLE)
    two.execute(TABLE)
    one.deliver("t", {"value": "a"}, id="e1")

    assert two.deliver("t", {"value": "a"}, id="e1").applied  # not a duplicate of one's
    assert one.schema != two.schema
    assert one.execute("SELECT current_schema()") == [(one.schema,)]
    one.close()
    with psycopg.connect(kinbox_database_url) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname IN (%s, %s)", (one.schema, two.schema)
        ).fetchall()
    assert left == [(two.schema,)]


def test_a_schema_given_by_the_test_is_migrated_and_kept(
    kinbox_database_url: str, schema_name: str
) -> None:
    with InboxTestClient(recording_app(), kinbox_database_url, schema=schema_name) as client:
        client.execute(TABLE)
        client.deliver("t", {"value": "a"}, id="e1")
    with InboxTestClient(recording_app(), kinbox_database_url, schema=schema_name) as again:
        assert again.deliver("t", {"value": "a"}, id="e1").duplicate


def test_a_topic_the_app_does_not_handle_is_refused(inbox_client: Client) -> None:
    with pytest.raises(ConfigurationError, match="no handler for topic 'other'"):
        inbox_client(recording_app()).deliver("other", {})


@pytest.fixture
def schema_name(kinbox_database_url: str) -> Any:
    name = f"kit_kept_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(kinbox_database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_outbox_migrates_the_outbox_so_a_chaining_handler_enqueues_once(
    inbox_client: Client,
) -> None:
    where: dict[str, str] = {}
    app = App(group_id="billing")

    @app.handler("orders")
    def bill(event: Event, tx: psycopg.Connection[Any]) -> None:
        enqueue(tx, "invoices", {"order": event.id}, key=event.id, schema=where["schema"])

    client = inbox_client(app, outbox=True)
    where["schema"] = client.schema

    first = client.deliver("orders", {}, id="o1")
    assert client.redeliver(first).duplicate
    assert client.execute("SELECT topic, payload->>'order' FROM outbox") == [("invoices", "o1")]
