"""The ``kinbox.dlq.*`` headers never push a dead letter over its topic's size limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.core.errors import TransportError
from kinbox.core.letter import PREFIX, RECORD_OVERHEAD_BYTES, Letter, headers
from kinbox.core.record import Record

pytestmark = pytest.mark.unit


def letter(value: bytes, message: str = "boom", reason: str = "handler-error") -> Letter:
    record = Record("orders", 2, 41, b"k", value, [("event-id", b"e-1"), ("trace", b"t")])
    return Letter(record, "orders.dlq", "g", reason, RuntimeError(message), 5)


def size(item: Letter, hs: list[tuple[str, bytes | None]]) -> int:
    r = item.record
    framing = RECORD_OVERHEAD_BYTES + len(r.key or b"") + len(r.value or b"")
    return framing + sum(len(k.encode()) + len(v or b"") for k, v in hs)


ESSENTIAL = ("topic", "partition", "offset", "consumer", "reason")


def bare_headers(hs: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    """The original headers and only the essential ``kinbox.dlq.*`` ones."""
    return [h for h in hs if not h[0].startswith(PREFIX) or h[0].removeprefix(PREFIX) in ESSENTIAL]


def names(hs: list[tuple[str, bytes | None]]) -> list[str]:
    return [k.removeprefix(PREFIX) for k, _ in hs if k.startswith(PREFIX)]


def test_without_a_limit_every_header_is_there() -> None:
    hs = headers(letter(b"x" * 100))
    assert names(hs) == [
        "topic", "partition", "offset", "consumer", "reason",
        "error.type", "error.message", "attempts", "time",
    ]  # fmt: skip
    assert hs[:2] == [("event-id", b"e-1"), ("trace", b"t")]


def test_close_to_the_limit_the_message_is_cut_before_anything_is_dropped() -> None:
    item = letter(b"x" * 5000, message="m" * 900)
    full = size(item, headers(item))
    hs = headers(item, max_bytes=full - 400)
    assert size(item, hs) <= full - 400
    message = dict(hs)[PREFIX + "error.message"]
    assert message is not None and message.endswith(b"...") and len(message) < 900
    assert "time" in names(hs) and "attempts" in names(hs)


def test_closer_still_optional_headers_go_and_where_from_and_why_stay() -> None:
    item = letter(b"x" * 5000, message="m" * 900)
    hs = headers(item, max_bytes=size(item, bare_headers(headers(item))))
    assert names(hs) == list(ESSENTIAL)
    assert dict(hs)[PREFIX + "reason"] == b"handler-error"


def test_a_record_that_cannot_fit_even_bare_is_refused_with_the_sizes() -> None:
    item = letter(b"x" * 5000)
    with pytest.raises(TransportError, match=r"cannot be dead-lettered to 'orders.dlq'") as err:
        headers(item, max_bytes=5000)
    assert not err.value.retriable


def test_unencodable_text_never_breaks_the_headers() -> None:
    item = letter(
        b"v", message="bad \udcff surrogate \x00 nul", reason="dead-letter-requested: \ud800"
    )
    hs = headers(item, max_bytes=10_000)
    assert b"\\udcff" in (dict(hs)[PREFIX + "error.message"] or b"")
    assert (dict(hs)[PREFIX + "reason"] or b"").startswith(b"dead-letter-requested: ")


@settings(max_examples=200, deadline=None)
@given(
    value=st.binary(max_size=3000),
    message=st.text(max_size=3000),
    reason=st.text(max_size=800),
    limit=st.integers(300, 8000),
)
def test_bounded_headers_never_exceed_the_limit(
    value: bytes, message: str, reason: str, limit: int
) -> None:
    item = letter(value, message=message, reason=reason)
    try:
        hs = headers(item, max_bytes=limit)
    except TransportError:
        # Refused only when even the bare record does not fit.
        assert size(item, bare_headers(headers(item))) > limit
        return
    assert size(item, hs) <= limit
    assert set(ESSENTIAL) <= set(names(hs))
