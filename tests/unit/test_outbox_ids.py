"""Time-ordered event ids (:mod:`producer_outbox.ids`): layout, order, uniqueness."""

from __future__ import annotations

import threading
import time
import uuid
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer_outbox import ids


def test_an_id_is_version_7_and_carries_the_current_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    made = ids.new_event_id()
    after = time.time_ns() // 1_000_000
    assert made.version == 7 and made.variant == uuid.RFC_4122
    # The id may stand one step past the clock (an earlier id in this
    # 1/4096 ms), never a whole millisecond.
    assert before <= made.int >> 80 <= after + 1


def test_ids_strictly_increase_as_numbers_and_as_text() -> None:
    made = [ids.new_event_id() for _ in range(20_000)]
    assert all(a.int < b.int for a, b in pairwise(made))
    # Text is what processed_events stores (event_id text): it sorts alike.
    texts = [str(m) for m in made]
    assert texts == sorted(texts) and len(set(texts)) == len(texts)


def test_a_clock_that_steps_back_still_gives_increasing_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = time.time_ns()
    first = ids.new_event_id()
    clock = iter([now - 5_000_000_000, now - 5_000_000_000, now - 4_000_000_000])
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    later = [ids.new_event_id() for _ in range(3)]
    assert first.int < later[0].int < later[1].int < later[2].int
    assert all(m.version == 7 for m in later)


def test_threads_never_share_an_id_and_each_sees_its_own_increase() -> None:
    made: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(into: list[uuid.UUID]) -> None:
        into.extend(ids.new_event_id() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(m,)) for m in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({m for own in made for m in own}) == 20_000
    for own in made:
        assert all(a.int < b.int for a, b in pairwise(own))


@given(st.integers(0, (1 << 60) - 1), st.integers(0, (1 << 62) - 1))
def test_the_fields_read_back(stamp: int, random_bits: int) -> None:
    made = ids.from_stamp(stamp, random_bits)
    assert made.version == 7 and made.variant == uuid.RFC_4122
    assert made.int >> 80 == stamp >> 12
    assert (made.int >> 64) & 0xFFF == stamp & 0xFFF
    assert made.int & ((1 << 62) - 1) == random_bits


@given(st.integers(0, 2**62), st.integers(1, 10**9))
def test_a_later_instant_never_has_a_smaller_stamp(when: int, later_by: int) -> None:
    assert ids.stamp_of(when) <= ids.stamp_of(when + later_by)


@pytest.mark.parametrize(("stamp", "random_bits"), [(-1, 0), (1 << 60, 0), (0, -1), (0, 1 << 62)])
def test_fields_that_do_not_fit_are_refused(stamp: int, random_bits: int) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        ids.from_stamp(stamp, random_bits)
