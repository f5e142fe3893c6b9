"""Reused event ids: a duplicate whose payload differs is not applied, and is reported.

Over the fakes: the digest, which duplicates the batch processor asks the
store about, what it logs and counts, and that a pass rolled back reports
nothing. The real stores' statement is checked in
``tests/integration/test_reused_ids.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.core.reuse import Sighting, packed_digests, payload_digest, payload_digests
from kinbox.store.statements import InboxStatements
from kinbox.store.transaction import ReusedPlan
from kinbox.testing import FakeStore, record
from kinbox.testing.store import FakeTransaction
from tests.unit.test_skim import effect_app, processor

pytestmark = pytest.mark.unit

T = "lessons"


def test_the_digest_is_a_stable_bigint_that_tells_payloads_apart() -> None:
    assert payload_digest(b'{"n": 1}') == payload_digest(b'{"n": 1}')
    assert payload_digest(b'{"n": 1}') != payload_digest(b'{"n": 2}')
    assert payload_digest(b"") != payload_digest(b"\x00")
    digests = [payload_digest(bytes([i])) for i in range(256)]
    assert all(-(2**63) <= d < 2**63 for d in digests)
    assert any(d < 0 for d in digests)  # signed, as PostgreSQL's bigint
    # Fixed across processes and versions (no per-process salt, as hash() has):
    # XXH3's 64 bits, read as a signed integer.
    assert payload_digest(b"kinbox") == int.from_bytes(
        bytes.fromhex("28801076243ccf48"), "big", signed=True
    )


@given(st.lists(st.binary(max_size=64), max_size=50))
def test_the_digests_of_many_values_are_each_ones_digest(values: list[bytes]) -> None:
    assert list(payload_digests(values)) == [payload_digest(v) for v in values]


@given(st.lists(st.binary(max_size=64), max_size=50))
def test_packed_digests_are_each_ones_bigint_as_postgresql_sends_it(values: list[bytes]) -> None:
    # int8send: eight bytes, big-endian, two's complement
    packed = b"".join(payload_digest(v).to_bytes(8, "big", signed=True) for v in values)
    assert packed_digests(values) == packed


def rec(offset: int, event_id: str, value: bytes) -> Record:
    return record(T, 0, offset, event_id, value=value)


@pytest.fixture(params=[False, True], ids=["per-event", "batch"])
def batch(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_the_same_payload_again_is_a_silent_duplicate(
    batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    app, store = effect_app(batch=batch), FakeStore()
    processor(app, store).process([rec(0, "a", b"1")])

    result = processor(app, store).process([rec(1, "a", b"1")])

    assert (result.applied, result.duplicates, result.reused) == (0, 1, 0)
    assert store.effects == ["a"] and store.sightings == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_another_payload_under_a_claimed_id_is_not_applied_but_reported(
    batch: bool, caplog: pytest.LogCaptureFixture
) -> None:
    app, store = effect_app(batch=batch), FakeStore()
    processor(app, store).process([rec(0, "a", b"1"), rec(1, "b", b"1")])

    result = processor(app, store).process([rec(7, "a", b"2"), rec(8, "c", b"1")])

    # Then the fresh event is applied, the reused id is not, and it is told
    assert (result.applied, result.duplicates, result.reused) == (1, 1, 1)
    assert store.effects == ["a", "b", "c"] and store.claimed["a"].value == b"1"
    [(key, sighting)] = store.sightings.items()
    assert key == ("a", T, 0, 7)
    assert (sighting.first, sighting.again) == (f"{T}[0]@0", f"{T}[0]@7")
    [line] = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = line.getMessage()
    assert "'a'" in text and "'g'" in text and f"{T}[0]@0" in text and f"{T}[0]@7" in text
    assert (line.__dict__["event_id"], line.__dict__["group"]) == ("a", "g")
    assert (line.__dict__["offset"], line.__dict__["first_offset"]) == (7, 0)


def test_a_record_seen_again_is_one_sighting(caplog: pytest.LogCaptureFixture) -> None:
    app, store = effect_app(), FakeStore()
    processor(app, store).process([rec(0, "a", b"1")])
    first = processor(app, store).process([rec(1, "a", b"2")])

    again = processor(app, store).process([rec(1, "a", b"2")])  # redelivered

    assert (first.reused, again.reused, again.duplicates) == (1, 0, 1)
    assert len(store.sightings) == 1
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_repeat_within_one_batch_is_compared_with_its_first_occurrence(batch: bool) -> None:
    app, store = effect_app(batch=batch), FakeStore()

    result = processor(app, store).process(
        [rec(0, "a", b"1"), rec(1, "a", b"1"), rec(2, "a", b"2")]
    )

    assert (result.applied, result.duplicates, result.reused) == (1, 2, 1)
    [sighting] = store.sightings.values()
    assert (sighting.first_offset, sighting.event.offset) == (0, 2)


def test_a_pass_rolled_back_reports_nothing_its_redo_reports_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a batch with a reused id and a dead letter: its first pass rolls
    # back for the dead letter to go out, and the batch is applied again
    app, store = effect_app(letter=["poison"]), FakeStore()
    processor(app, store).process([rec(0, "a", b"1")])

    result = processor(app, store).process([rec(1, "a", b"2"), rec(2, "poison", b"1")])

    assert (result.dead_lettered, result.reused) == (1, 1)
    assert len(store.sightings) == 1
    assert len([r for r in caplog.records if "reused" in r.getMessage()]) == 1


def test_only_a_batch_with_duplicates_asks_the_store_about_reuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[int]] = []
    real = FakeTransaction.reused

    def reused(self: FakeTransaction, events: Sequence[Event]) -> list[Sighting]:
        asked.append([e.offset for e in events])
        return real(self, events)

    monkeypatch.setattr(FakeTransaction, "reused", reused)
    app, store = effect_app(), FakeStore()
    processor(app, store).process([rec(0, "a", b"1"), rec(1, "b", b"1")])
    assert asked == []  # a clean batch: no step more than before

    processor(app, store).process([rec(2, "c", b"1"), rec(3, "a", b"1"), rec(4, "d", b"1")])
    assert asked == [[3]]  # only the duplicates


def test_the_statement_plan_maps_the_rows_back_to_their_events() -> None:
    events = [
        Event("a", T, 0, 5, None, b"x"),
        Event("b", T, 0, 6, None, b"y"),
        Event("c", "other", 1, 2, None, b"z"),
    ]
    plan = ReusedPlan(InboxStatements.of("kinbox"), "g", events)

    positional = [params for _, params in plan.statements if isinstance(params, tuple)]
    assert [params[:2] for params in positional] == [(T, 0), ("other", 1)]
    assert positional[0][2:] == (
        '{"a","b"}', "{5,6}", f"{{{payload_digest(b'x')},{payload_digest(b'y')}}}", "g",
    )  # fmt: skip
    plan.take([("other", 1, 2, T, 0, 1)])
    plan.take([(T, 0, 6, T, 0, 0)])
    assert plan.result() == [Sighting(events[1], T, 0, 0), Sighting(events[2], T, 0, 1)]
