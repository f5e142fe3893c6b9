"""Key order: a partition batch applied a unit per key, side by side, under one watermark."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.keyed import KeyOrder, batch_length, units, watermark
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event
from kinbox.core.outcome import BatchResult, Failure
from kinbox.core.record import Record
from kinbox.testing import FakeStore, FakeTransport, record
from tests.unit.test_breaker import Held

pytestmark = pytest.mark.unit


def keyed(offset: int, key: str | None, topic: str = "t") -> Record:
    return record(topic, 0, offset, f"ev-{offset}")._replace(
        key=None if key is None else key.encode()
    )


def test_units_group_records_by_key_in_offset_order_and_keyless_records_share_one() -> None:
    records = [keyed(0, "a"), keyed(1, "b"), keyed(2, None), keyed(3, "a"), keyed(4, None)]
    assert [[r.offset for r in u] for u in units(records)] == [[0, 3], [1], [2, 4]]


def _unit_result(unit: Sequence[Record], stop: int | None) -> BatchResult:
    """What applying ``unit`` returns when it stops at its ``stop``-th record (or never)."""
    if stop is None:
        return BatchResult(unit[-1].offset + 1, applied=len(unit))
    failed = unit[stop]
    failure = Failure(failed.topic, failed.partition, failed.offset, 1, RuntimeError("no"))
    return BatchResult(unit[stop - 1].offset + 1 if stop else None, failure, applied=stop)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from(["a", "b", "c", "d", None]), min_size=1, max_size=40),
    data=st.data(),
)
def test_the_watermark_never_passes_an_unsettled_record(
    keys: list[str | None], data: st.DataObject
) -> None:
    # Given a batch over random keys, each unit ending after any number of
    # its records settled, in any order the units happen to end in
    records = [keyed(10 + n, k) for n, k in enumerate(keys)]
    split = units(records)
    stops = [data.draw(st.one_of(st.none(), st.integers(0, len(u) - 1))) for u in split]
    ended = data.draw(st.permutations(range(len(split))))
    results = [_unit_result(split[i], stops[i]) for i in ended]
    # When the results are merged
    merged = watermark(records, results)
    # Then the offset committed lies at or below every unsettled record, and
    # is the first of them (or past the batch's end): nothing settled is
    # held back needlessly, nothing unsettled is passed
    unsettled = [
        r.offset for u, stop in zip(split, stops, strict=True) if stop is not None for r in u[stop:]
    ]
    first = min(unsettled, default=records[-1].offset + 1)
    if first == records[0].offset:
        assert merged.next_offset is None
    else:
        assert merged.next_offset == first
    assert (merged.failure is None) == (not unsettled)
    if merged.failure is not None:
        assert merged.failure.offset == first
    assert merged.applied == sum(r.applied for r in results)


def test_units_run_side_by_side_each_key_in_one_call_in_offset_order() -> None:
    # Given a route applying three keys at once, whose units wait for each other
    started = threading.Barrier(3, timeout=30)
    calls: list[tuple[list[int], int]] = []
    lock = threading.Lock()

    def apply(unit: Sequence[Record], attempt: int, skim: bool) -> BatchResult:
        started.wait()  # passes only if all three units run at once
        with lock:
            calls.append(([r.offset for r in unit], attempt))
        return BatchResult(unit[-1].offset + 1, applied=len(unit))

    order = KeyOrder("t", 3, apply)
    try:
        records = [keyed(5, "a"), keyed(6, "b"), keyed(7, "c"), keyed(8, "a"), keyed(9, "b")]
        # When a batch is processed on its third try
        result = order.process(records, 3, False)
    finally:
        order.close()
    # Then each key went whole to one call, in offset order; only the unit of
    # the batch's first record is on that try; everything settled
    assert sorted(calls) == [([5, 8], 3), ([6, 9], 1), ([7], 1)]
    assert result.next_offset == 10 and result.failure is None and result.applied == 5


def test_a_unit_that_raises_is_raised_once_every_unit_ended() -> None:
    ended: list[int] = []

    def apply(unit: Sequence[Record], attempt: int, skim: bool) -> BatchResult:
        if unit[0].key == b"bad":
            raise RuntimeError("hook failed")
        ended.append(unit[0].offset)
        return BatchResult(unit[-1].offset + 1)

    order = KeyOrder("t", 2, apply)
    try:
        with pytest.raises(RuntimeError, match="hook failed"):
            order.process([keyed(0, "bad"), *(keyed(n, f"k{n}") for n in range(1, 6))], 1, False)
    finally:
        order.close()
    assert sorted(ended) == [1, 2, 3, 4, 5]


def test_a_failing_key_stops_the_partition_at_its_record_while_other_keys_commit() -> None:
    # Given a key-ordered handler whose key "x" fails at offset 2
    app = App(group_id="g")
    applied: list[tuple[str, int]] = []

    @app.handler("t", ordering="key", concurrency=4)
    def on_event(event: Event, tx: Any) -> None:
        if event.offset == 2:
            raise RuntimeError("x is not ready")
        applied.append((event.key.decode() if event.key else "-", event.offset))

    store = FakeStore()
    processor = BatchProcessor(app.routes, store, ["event-id"], consumer="g")
    keys = ["a", "b", "x", "a", "x", "b", None, "a"]
    records = [keyed(n, k) for n, k in enumerate(keys)]
    try:
        # When a batch is processed
        result = processor.process(records)
        # Then the keys other than x committed all their records, x none
        # from its failure on, and the partition stops at offset 2
        assert sorted(applied) == [("-", 6), ("a", 0), ("a", 3), ("a", 7), ("b", 1), ("b", 5)]
        assert result.failure is not None and result.failure.offset == 2
        assert result.next_offset == 2
        # And when the partition is read again from there, on the next try,
        # the records settled already are duplicates, and x holds at 2 still
        applied.clear()
        again = processor.process(records[2:], 2)
    finally:
        processor.close()
    assert again.failure is not None and again.failure.offset == 2  # it still fails
    assert again.duplicates == 4 and again.applied == 0


def test_key_order_applies_every_event_once_across_random_batches() -> None:
    rng = random.Random(7)
    app = App(group_id="g")
    seen: list[tuple[bytes | None, int]] = []
    lock = threading.Lock()

    @app.handler("t", ordering="key", concurrency=5)
    def on_event(event: Event, tx: Any) -> None:
        with lock:
            seen.append((event.key, event.offset))

    processor = BatchProcessor(app.routes, FakeStore(), ["event-id"], consumer="g")
    records = [keyed(n, rng.choice(["a", "b", "c", None])) for n in range(200)]
    try:
        start = 0
        while start < len(records):
            end = start + rng.randint(1, 30)
            # batches overlap at random: a rewound partition delivers again
            result = processor.process(records[max(0, start - rng.randint(0, 5)) : end])
            assert result.next_offset == min(end, len(records))
            start = end
    finally:
        processor.close()
    assert sorted(o for _, o in seen) == list(range(200))
    for key in (b"a", b"b", b"c", None):
        offsets = [o for k, o in seen if k == key]
        assert offsets == sorted(offsets)


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from(["a", "b", "c", None]), max_size=40),
    batch=st.integers(1, 6),
    concurrency=st.integers(1, 5),
)
def test_a_key_ordered_batch_takes_the_longest_prefix_with_no_key_over_a_batch(
    keys: list[str | None], batch: int, concurrency: int
) -> None:
    waiting = [keyed(n, k) for n, k in enumerate(keys)]
    length = batch_length(waiting, batch, concurrency)
    most = min(len(waiting), batch * concurrency)
    assert (length >= 1 or not waiting) and length <= most
    taken = [r.key for r in waiting[:length]]
    assert all(taken.count(key) <= batch for key in taken)
    if length < most:  # it stopped only where the next record's key had a batch's worth
        assert taken.count(waiting[length].key) == batch


def test_a_key_ordered_partition_batch_takes_several_batches_of_its_lane() -> None:
    # Given a key-ordered handler, batches of 2, and records waiting while the
    # partition's first batch is in flight, "a" among them three times
    transport, executor = FakeTransport(), Held()
    app, store = App(group_id="g"), FakeStore()
    batches: list[list[int]] = []

    @app.handler("t", ordering="key", concurrency=3)
    def on_event(event: Event, tx: Any) -> None:
        pass

    config = Settings(database_url="postgresql:///x", group_id="g", batch_max_messages=2)
    runner = Runner(app, config.validate(), transport, store, executor=executor)
    original = runner._processor.process  # to see which records each batch took

    def process(records: Sequence[Record], attempt: int = 1, *, skim: bool = False) -> BatchResult:
        batches.append([r.offset for r in records])
        return original(records, attempt, skim=skim)

    runner._processor.process = process  # type: ignore[method-assign]
    for n, key in enumerate(["x", "y", "a", "b", "a", "c", "a", "d", "e", "f", "g"]):
        transport.append(keyed(n, key))
    transport.subscribe(app.topics, runner)
    for _ in range(8):  # the first batch stays in flight while the rest is fetched
        runner.turn()
    assert runner._flow.lanes.waiting(("t", 0)) >= 8
    for _ in range(8):
        executor.release()
        runner.turn()
    try:
        # Then the first batch is one poll's two records; the next would take
        # up to three batches' worth (six), but stops before a third "a"; the
        # one after it again takes more than a batch
        assert batches[:2] == [[0, 1], [2, 3, 4, 5]]
        assert batches[2][0] == 6 and len(batches[2]) > 2
        assert sorted(o for b in batches for o in b) == list(range(11))
        assert transport.committed[("t", 0)] == 11
    finally:
        runner._processor.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ordering": "keys"}, "use 'partition' or 'key'"),
        ({"concurrency": 4}, "needs ordering='key'"),
        ({"ordering": "key", "concurrency": 0}, "use 1..256"),
        ({"ordering": "key", "concurrency": True}, "use 1..256"),
    ],
)
def test_bad_ordering_or_concurrency_is_refused_at_registration(
    kwargs: dict[str, Any], message: str
) -> None:
    app = App()
    with pytest.raises(ConfigurationError, match=message):
        app.handler("t", **kwargs)


def test_key_order_defaults_and_the_connections_it_needs() -> None:
    app = App()
    app.handler("a", ordering="key")(lambda event, tx: None)
    app.handler("b", ordering="key", concurrency=3)(lambda event, tx: None)
    app.handler("c")(lambda event, tx: None)
    assert [app.routes[t].concurrency for t in "abc"] == [16, 3, 1]
    assert app.key_connections == 19
