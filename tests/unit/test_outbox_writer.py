from __future__ import annotations

import math
import uuid
from typing import Any, cast

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.core.cause import handling
from kinbox.core.errors import ConfigurationError, ConflictError, StoreError
from kinbox.store.migrations import render
from producer_outbox import PayloadError
from producer_outbox.schema import OUTBOX, notify_channel
from producer_outbox.writer import check_headers, encode_payload, enqueue


class FakeConnection:
    def __init__(self, fails: psycopg.Error | None = None, *, broken: bool = False) -> None:
        self.calls: list[tuple[Any, Any]] = []
        self.fails = fails
        self.broken = broken

    def execute(self, statement: Any, params: Any = None) -> FakeConnection:
        self.calls.append((statement, params))
        if self.fails is not None:
            raise self.fails
        return self

    def fetchone(self) -> None:
        return None


def _enqueue(fake: FakeConnection, *args: Any, **kwargs: Any) -> uuid.UUID:
    return enqueue(cast(psycopg.Connection[Any], fake), *args, **kwargs)


def test_bytes_are_stored_raw_and_objects_as_json() -> None:
    assert encode_payload(b"\x00\x01") == (None, b"\x00\x01")
    assert encode_payload(bytearray(b"ab"))[1] == b"ab"
    json_value, raw = encode_payload({"a": [1, "é"]})
    assert raw is None and json_value is not None


@pytest.mark.parametrize("bad", [object(), {1, 2}, math.nan, {"x": math.inf}, "nul\x00"])
def test_unserialisable_payload_is_refused(bad: object) -> None:
    with pytest.raises(PayloadError) as info:
        encode_payload(bad)
    assert isinstance(info.value, TypeError)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)


@given(_JSON)
def test_any_json_document_encodes_or_fails_clearly(value: object) -> None:
    try:
        encode_payload(value)
    except PayloadError as exc:
        assert "U+0000" in str(exc)


def test_headers_must_be_text_and_not_reserved() -> None:
    assert check_headers(None) == {}
    assert check_headers({"trace": "x"}) == {"trace": "x"}
    with pytest.raises(PayloadError):
        check_headers({"trace": b"x"})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="event-id"):
        check_headers({"event-id": "x"})


def test_enqueue_is_one_insert_and_leaves_the_wake_up_to_the_table() -> None:
    fake = FakeConnection()
    event_id = uuid.uuid4()
    assert _enqueue(fake, "lesson-events", {"a": 1}, key="u1", event_id=event_id) == event_id
    ((statement, params),) = fake.calls
    text = statement.as_string(None)
    # The outbox_notify trigger wakes the relay for every writer (schema step 6).
    assert text.startswith('INSERT INTO "kinbox".outbox') and "pg_notify" not in text
    assert params[0] == event_id and params[1] == params[2] == "lesson-events"
    assert params[3] == "u1" and len(params) == 8


def test_enqueue_gives_each_event_a_fresh_time_ordered_id() -> None:
    fake = FakeConnection()
    made = [_enqueue(fake, "lesson-events", {"n": n}) for n in range(3)]
    assert all(m.version == 7 for m in made)
    assert made[0].int < made[1].int < made[2].int
    assert [params[0] for _, params in fake.calls] == made


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("bad topic!", {}), {}),
        (("t", {}), {"schema": "Bad-Schema"}),
        (("t", {}), {"key": 5}),
        (("t", {}), {"event_id": "not-a-uuid"}),
    ],
)
def test_enqueue_validates_before_touching_the_database(args: Any, kwargs: Any) -> None:
    fake = FakeConnection()
    with pytest.raises(ConfigurationError):
        _enqueue(fake, *args, **kwargs)
    assert fake.calls == []


@pytest.mark.parametrize(
    ("raised", "broken", "transient"),
    [
        (psycopg.errors.UndefinedTable("no outbox"), False, False),
        (psycopg.errors.NotNullViolation("null topic"), False, False),
        (psycopg.errors.LockNotAvailable("lock_timeout"), False, True),
        (psycopg.errors.QueryCanceled("statement_timeout"), False, True),
        (psycopg.errors.DiskFull("no space"), False, True),
        (psycopg.errors.AdminShutdown("terminated"), False, True),
        (psycopg.InterfaceError("the connection is closed"), True, True),
        (psycopg.errors.UndefinedTable("no outbox"), True, True),
    ],
)
def test_a_failed_insert_is_judged_as_kinbox_judges_its_own_statements(
    raised: psycopg.Error, broken: bool, transient: bool
) -> None:
    # transient: trying the caller's transaction again may succeed; the
    # connection's state decides before the error's class does.
    fake = FakeConnection(raised, broken=broken)
    with pytest.raises(StoreError, match=r"cannot enqueue event .* for topic 'lessons'") as info:
        _enqueue(fake, "lessons", {"n": 1})
    assert info.value.transient is transient
    assert info.value.__cause__ is raised


@pytest.mark.parametrize(
    "raised",
    [psycopg.errors.DeadlockDetected("deadlock"), psycopg.errors.SerializationFailure("rw")],
)
def test_a_conflict_at_the_insert_is_a_conflict_error(raised: psycopg.Error) -> None:
    with pytest.raises(ConflictError) as info:
        _enqueue(FakeConnection(raised), "lessons", {"n": 1})
    assert info.value.transient and info.value.__cause__ is raised


def test_a_failed_lookup_of_the_optional_columns_is_judged_as_the_insert_is() -> None:
    # Inside a handler, enqueue first asks whether the outbox has the cause columns.
    class LostInfo:
        host, port, dbname = "db.example", 5432, "lost_before_lookup"

    fake = FakeConnection(psycopg.OperationalError("server closed the connection"), broken=True)
    fake.info = LostInfo()  # type: ignore[attr-defined]
    with handling("orders-consumer", "e1"), pytest.raises(StoreError) as info:
        _enqueue(fake, "lessons", {"n": 1})
    assert info.value.transient and "cannot enqueue event" in str(info.value)
    assert "pg_attribute" in str(fake.calls[0][0])


def test_migration_renders_the_outbox_table() -> None:
    ddl = render("kinbox", [OUTBOX])
    assert 'CREATE TABLE IF NOT EXISTS "kinbox".outbox' in ddl
    assert "WHERE status = 'pending'" in ddl
    assert "id uuid PRIMARY KEY" in ddl and "aggregateid text" in ddl
    assert 'CREATE TRIGGER outbox_notify AFTER INSERT ON "kinbox".outbox FOR EACH STATEMENT' in ddl


def test_notify_channel_fits_the_identifier_limit() -> None:
    assert len(notify_channel("s" * 63)) <= 63
