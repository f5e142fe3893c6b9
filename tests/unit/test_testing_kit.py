"""The test kit's parts that need no server: messages, the recording store's faults, snapshots."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event
from kinbox.testing import FakeConn, FakeStore, Message
from kinbox.testing.messages import encode_payload
from kinbox.testing.recorder import InjectedCrash, RecordingStore
from kinbox.testing.snapshot import Snapshot, Table, compare, volatile

pytestmark = pytest.mark.unit


@dataclasses.dataclass
class Lesson:
    user: str


class Model:
    """Quacks like a pydantic model."""

    def model_dump_json(self) -> str:
        return '{"m": 1}'


def test_payloads_encode_as_a_producer_would_send_them() -> None:
    assert encode_payload(b"raw") == b"raw"
    assert encode_payload(bytearray(b"ba")) == b"ba"
    assert encode_payload("é") == "é".encode()
    assert encode_payload(None) is None
    assert encode_payload({"a": [1]}) == b'{"a": [1]}'
    assert encode_payload(Lesson("u")) == b'{"user": "u"}'
    assert encode_payload(Model()) == b'{"m": 1}'
    with pytest.raises(TypeError):
        encode_payload(object())


def test_the_id_header_comes_first_unless_absent_or_given_in_the_headers() -> None:
    plain = Message("t", id="e1", headers={"trace": "x"}).record(0, 7, "event-id")
    none = Message("t", id=None).record(0, 0, "event-id")
    own = Message("t", id="ignored", headers=[("event-id", b"mine")]).record(0, 0, "event-id")

    assert plain.headers == [("event-id", b"e1"), ("trace", b"x")] and plain.offset == 7
    assert none.headers == []
    assert own.headers == [("event-id", b"mine")]
    assert Message("t").id != Message("t").id  # a fresh one each time


def test_a_key_always_maps_to_the_same_partition() -> None:
    places = {Message("t", key=f"k{i % 5}").partition_for(4) for i in range(50)}
    assert places <= set(range(4))
    assert len({Message("t", key="k1").partition_for(4) for _ in range(10)}) == 1
    assert Message("t").partition_for(4) == 0
    with pytest.raises(ValueError, match="partition 4"):
        Message("t", partition=4).partition_for(4)


def processor(store: RecordingStore) -> BatchProcessor:
    app = App(group_id="g", middleware=[])

    @app.handler("t")
    def handle(event: Event, tx: FakeConn) -> None:
        tx.effects.append(event.id)

    return BatchProcessor(app.routes, store, ["event-id"], consumer="g")


def test_a_crash_rolls_back_and_escapes_every_except_exception() -> None:
    inner = FakeStore()
    store = RecordingStore(inner)
    record = Message("t", id="e1").record(0, 0, "event-id")
    store.faults = {("t", 0, 0): ["crash"]}

    with pytest.raises(InjectedCrash):
        processor(store).process([record])

    assert inner.effects == [] and inner.commits == 0 and store.ledger.applied == set()
    assert store.injected == [("crash", ("t", 0, 0))]


def test_a_transient_fault_rolls_back_and_a_lost_commit_answer_keeps_the_commit() -> None:
    inner = FakeStore()
    store = RecordingStore(inner)
    records = [Message("t", id=f"e{i}").record(0, i, "event-id") for i in range(2)]
    store.faults = {("t", 0, 0): ["transient"], ("t", 0, 1): ["lost-commit"]}
    batch = processor(store)

    transient = batch.process(records[:1])
    lost = batch.process(records[1:])

    assert transient.failure is not None and transient.failure.kind == "store"
    assert lost.failure is not None and lost.failure.kind == "store"
    assert inner.effects == ["e1"]  # the lost answer's transaction did commit
    assert store.ledger.applied == {("t", 0, 1)}
    assert batch.process(records[1:]).duplicates == 1  # and its retry finds it done


def table(name: str, *columns: str, **sequenced: str) -> Table:
    return Table(name, columns, sequenced)


def snapshot(**rows: list[tuple[Any, ...]]) -> Snapshot:
    return Snapshot({name: Counter(found) for name, found in rows.items()})


def test_sequenced_columns_and_columns_unlike_in_two_clean_runs_are_left_out() -> None:
    tables = {"orders": table("orders", "id", "user", "at", id="filled from a sequence")}
    first = snapshot(orders=[("1", "u1", "10:00"), ("2", "u2", "10:00")])
    second = snapshot(orders=[("1", "u1", "10:01"), ("2", "u2", "10:01")])
    faulty = snapshot(orders=[("2", "u1", "10:02"), ("3", "u2", "10:02")])

    ignored = volatile(first, second, tables)

    assert ignored == {
        "orders": {"id": "filled from a sequence", "at": "differs between two clean runs"}
    }
    assert compare(first, faulty, tables, ignored) == []


def test_an_extra_row_is_reported_with_its_values() -> None:
    tables = {"audit": table("audit", "event_id")}
    clean = snapshot(audit=[("e1",)])
    faulty = snapshot(audit=[("e1",), ("e1",)])

    (difference,) = compare(clean, faulty, tables, {})

    assert (difference.clean, difference.faulty, difference.extra) == (1, 2, (("e1",),))
    assert str(difference).splitlines() == [
        "table audit: 2 row(s), where one clean delivery of each event leaves 1",
        "  only after the faults: (event_id='e1')",
    ]


def test_two_clean_runs_of_different_sizes_cannot_stand_as_the_reference() -> None:
    tables = {"audit": table("audit", "event_id")}
    with pytest.raises(ConfigurationError, match="with 1 and 2 rows"):
        volatile(snapshot(audit=[("e1",)]), snapshot(audit=[("e1",), ("e2",)]), tables)
