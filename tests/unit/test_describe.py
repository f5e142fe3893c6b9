"""Turning exceptions and records into text that can always be stored and sent."""

from __future__ import annotations

from typing import Any, cast

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
from hypothesis import given
from hypothesis import strategies as st

from kinbox.core.describe import clean, describe, storable, text, type_name
from kinbox.kafka.consumer import to_record
from kinbox.testing import postgres_accepts

pytestmark = pytest.mark.unit

# Any str: lone surrogates and NUL included.
any_text = st.text(st.characters(exclude_categories=()))


@given(any_text, st.integers(3, 2000))
def test_clean_is_always_storable_and_bounded(value: str, limit: int) -> None:
    out = clean(value, limit)
    assert postgres_accepts(out)
    assert len(out.encode("utf-8")) <= limit


@given(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")))
def test_clean_leaves_storable_text_alone(value: str) -> None:
    assert clean(value, None) == value


def test_clean_escapes_what_cannot_be_stored() -> None:
    assert clean("a\x00b\udcffc") == "a\\x00b\\udcffc"


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("broken")


class BrokenBoth(Exception):
    def __str__(self) -> str:
        raise RuntimeError("broken")

    def __repr__(self) -> str:
        raise RuntimeError("broken too")


def test_describe_never_raises() -> None:
    assert describe(ValueError("no such customer")) == "ValueError: no such customer"
    assert describe(KeyError()) == "KeyError"
    assert describe(BrokenStr("x")) == "BrokenStr: BrokenStr('x')"
    assert describe(BrokenBoth()) == "BrokenBoth: <unprintable BrokenBoth>"
    assert describe(ValueError("\x00 \udcff")) == "ValueError: \\x00 \\udcff"
    assert type_name(ValueError()) == "ValueError"
    assert len(describe(ValueError("é" * 10_000)).encode()) <= 1000
    assert text(b"\xff") == "b'\\xff'"


def test_reasons_are_escaped_for_a_database_that_is_not_utf8() -> None:
    assert storable("café \x00", "UTF8") == "café \\x00"
    assert storable("café 日本", "LATIN1") == "caf\\xe9 \\u65e5\\u672c"
    assert storable("plain", "SQL_ASCII") == "plain"


class FakeMessage:
    """A consumed message whose ``headers()`` fails as confluent-kafka's does on a bad name."""

    def __init__(self, headers: Any) -> None:
        self._headers = headers
        self.header_calls = 0

    def headers(self) -> Any:
        self.header_calls += 1
        if isinstance(self._headers, BaseException):
            raise self._headers
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1_700_000_000_000

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 1

    def offset(self) -> int:
        return 7

    def key(self) -> bytes:
        return b"\x00\xff"

    def value(self) -> bytes:
        return b"\xff payload"


def test_a_record_whose_headers_cannot_be_decoded_still_becomes_a_record() -> None:
    failure = SystemError("<method 'headers'> returned a result with an exception set")
    failure.__context__ = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    msg = FakeMessage(failure)
    record = to_record(cast(Message, msg))
    assert (record.topic, record.partition, record.offset) == ("t", 1, 7)
    assert (record.key, record.value, record.headers) == (b"\x00\xff", b"\xff payload", [])
    assert record.headers_error is not None
    assert record.headers_error.startswith("UnicodeDecodeError: 'utf-8' codec can't decode")
    # called once: confluent-kafka caches a broken list after the failure
    assert msg.header_calls == 1


def test_a_record_with_readable_headers_keeps_them() -> None:
    record = to_record(cast(Message, FakeMessage([("event-id", b"a\x00")])))
    assert record.headers == [("event-id", b"a\x00")] and record.headers_error is None
