"""The trace id read from a record's traceparent header: valid ones, and everything else as None."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.core.traceparent import trace_id

pytestmark = pytest.mark.unit

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
Headers = list[tuple[str, bytes | None]]
VALID = f"00-{TRACE}-00f067aa0ba902b7-01".encode()


def test_the_trace_id_of_a_valid_header() -> None:
    assert trace_id([("event-id", b"e1"), ("traceparent", VALID)]) == TRACE


def test_a_later_version_may_carry_more_fields() -> None:
    assert trace_id([("traceparent", f"01-{TRACE}-00f067aa0ba902b7-01-extra".encode())]) == TRACE


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"garbage",
        VALID.upper(),  # hex must be lower case
        VALID + b"-more",  # version 00 has four fields exactly
        b"ff" + VALID[2:],  # version ff is invalid
        f"00-{'0' * 32}-00f067aa0ba902b7-01".encode(),  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01".encode(),  # all-zero parent id
        f"00-{TRACE[:-1]}-00f067aa0ba902b7-01".encode(),  # 31 digits
        b"\xff\xfe" + VALID,  # not even text
        VALID.replace(b"-", b"\x00", 1),
    ],
)
def test_anything_malformed_is_none(value: bytes | None) -> None:
    assert trace_id([("traceparent", value)]) is None


def test_only_the_first_traceparent_counts_and_other_names_never() -> None:
    assert trace_id([("traceparent", b"bad"), ("traceparent", VALID)]) is None
    assert trace_id([("Traceparent", VALID), ("x-traceparent", VALID)]) is None
    assert trace_id([]) is None


@given(st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=80)))))
def test_it_never_raises_and_returns_32_hex_or_none(headers: Headers) -> None:
    found = trace_id(headers)
    assert found is None or (len(found) == 32 and int(found, 16) > 0)
