"""W3C Trace Context read from and written to headers: whatever a producer wrote, never an error."""

from __future__ import annotations

import pytest

from kinbox.core.otel.propagation import creation_context, formatted, parse

pytestmark = pytest.mark.unit

TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"


def test_a_valid_traceparent_round_trips_with_its_tracestate() -> None:
    context = parse(VALID, "vendor=a,other=b")
    assert context is not None and context.is_remote and context.trace_flags.sampled
    assert formatted(context) == (VALID, "vendor=a,other=b")
    unsampled = parse(f"00-{TRACE}-{PARENT}-00")
    assert unsampled is not None and not unsampled.trace_flags.sampled
    assert formatted(unsampled) == (f"00-{TRACE}-{PARENT}-00", None)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE.upper()}-{PARENT}-01",  # hex is lower case
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}-{PARENT}-01",
    ],
)
def test_a_malformed_traceparent_is_no_context(value: str) -> None:
    assert parse(value) is None


def test_a_later_version_may_append_fields() -> None:
    assert parse(f"01-{TRACE}-{PARENT}-01-what-comes-next") is not None


def test_headers_give_the_first_traceparent_and_every_tracestate() -> None:
    headers = [
        ("event-id", b"e1"),
        ("traceparent", VALID.encode()),
        ("tracestate", b"a=1"),
        ("traceparent", f"00-{'1' * 32}-{PARENT}-01".encode()),
        ("tracestate", b"b=2"),
    ]
    context = creation_context(headers)
    assert context is not None and f"{context.trace_id:032x}" == TRACE
    assert context.trace_state.to_header() == "a=1,b=2"
    assert creation_context([("event-id", b"e1")]) is None
    assert creation_context([("traceparent", None)]) is None
    assert creation_context([("traceparent", b"\xff\xfe")]) is None
