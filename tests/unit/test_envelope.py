from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.apply.envelope import MAX_ID_BYTES, event_id, to_event
from kinbox.core.errors import EnvelopeError
from kinbox.core.record import Record

pytestmark = pytest.mark.unit

ORDER = ("event-id", "ce_id", "id")


def rec(*headers: tuple[str, bytes | None]) -> Record:
    return Record("t", 2, 41, b"k", b'{"a": 1}', list(headers), 123)


def test_first_configured_header_wins() -> None:
    assert event_id(rec(("id", b"deb"), ("ce_id", b"ce"), ("event-id", b"ev")), ORDER) == "ev"
    assert event_id(rec(("id", b"deb"), ("ce_id", b"ce")), ORDER) == "ce"
    assert event_id(rec(("id", b"deb")), ORDER) == "deb"
    assert event_id(rec(("id", b"deb"), ("ce_id", b"ce")), ("id", "ce_id")) == "deb"


def test_event_carries_record_fields() -> None:
    event = to_event(rec(("event-id", b"x")), ORDER, attempt=2)
    assert (event.id, event.topic, event.partition, event.offset) == ("x", "t", 2, 41)
    assert event.json() == {"a": 1}
    assert event.attempt == 2 and event.key == b"k" and event.timestamp == 123
    assert event.header("event-id") == b"x"


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ((), "no event id header"),
        ((("event-id", b""),), "empty"),
        ((("event-id", None),), "empty"),
        ((("event-id", b"\xff\xfe"),), "not UTF-8"),
        ((("event-id", b"x" * (MAX_ID_BYTES + 1)),), "at most 255"),
        ((("event-id", b"a"), ("event-id", b"b")), "different values"),
        ((("event-id", b"a\x00b"),), "holds NUL, which PostgreSQL cannot store"),
    ],
)
def test_bad_ids_raise_envelope_error_with_location(
    headers: tuple[tuple[str, bytes | None], ...], reason: str
) -> None:
    with pytest.raises(EnvelopeError, match=reason) as info:
        event_id(rec(*headers), ORDER)
    assert (info.value.topic, info.value.partition, info.value.offset) == ("t", 2, 41)
    assert "t[2]@41" in str(info.value)


def test_repeated_header_with_same_value_is_fine() -> None:
    assert event_id(rec(("event-id", b"a"), ("event-id", b"a")), ORDER) == "a"


def test_tombstone_value_is_empty_bytes() -> None:
    event = to_event(Record("t", 0, 0, None, None, [("event-id", b"x")]), ORDER)
    assert event.value == b""


# Valid: 1-255 bytes of UTF-8 without NUL (PostgreSQL text cannot hold NUL).
@given(st.text(min_size=1).filter(lambda s: len(s.encode()) <= MAX_ID_BYTES and "\x00" not in s))
def test_any_valid_id_round_trips(value: str) -> None:
    assert event_id(rec(("event-id", value.encode())), ORDER) == value


def test_unreadable_headers_mean_no_id() -> None:
    record = Record("t", 2, 41, b"k", b"v", [], 123, headers_error="UnicodeDecodeError: ...")
    with pytest.raises(EnvelopeError, match="headers cannot be read: UnicodeDecodeError"):
        event_id(record, ORDER)
