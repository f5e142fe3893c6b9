"""Key-ordered parking: a dead letter holds its key's later events until it is released."""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core.errors import ConfigurationError, DeadLetter
from kinbox.core.event import Event
from kinbox.core.letter import REPLAY_HEADER
from kinbox.core.parking import Parked
from kinbox.core.record import Record
from kinbox.testing import FakePublisher, FakeStore, record

pytestmark = pytest.mark.unit

TOPIC = "orders"


def keyed(offset: int, event_id: str, key: str | None) -> Record:
    return record(TOPIC, 0, offset, event_id)._replace(
        key=None if key is None else key.encode(), value=event_id.encode()
    )


def released(parked: list[Parked], first_offset: int) -> list[Record]:
    """The records a release re-publishes, as they come back at the end of the partition."""
    return [
        Record(
            TOPIC, 0, first_offset + n, p.key, p.value,
            [*p.headers, (REPLAY_HEADER, f"{TOPIC}/{p.partition}/{p.offset}".encode())],
        )
        for n, p in enumerate(parked)
    ]  # fmt: skip


class Orders:
    """An app whose handler dead-letters the ids in :attr:`poison` and logs the rest."""

    def __init__(self, *, batch: bool = False, ordering: str = "partition") -> None:
        self.app = App(group_id="g")
        self.poison: set[str] = set()
        extra: dict[str, Any] = {"ordering": ordering} if ordering == "key" else {}

        if batch:

            @self.app.handler(TOPIC, batch=True, park_keys=True, max_attempts=1, **extra)
            def on_batch(events: list[Event], tx: Any) -> None:
                for event in events:
                    self._one(event, tx)
        else:

            @self.app.handler(TOPIC, park_keys=True, **extra)
            def on_event(event: Event, tx: Any) -> None:
                self._one(event, tx)

        self.store = FakeStore()
        self.processor = BatchProcessor(
            self.app.routes, self.store, ["event-id"], consumer="g", publisher=FakePublisher()
        )

    def _one(self, event: Event, tx: Any) -> None:
        if event.id in self.poison:
            raise DeadLetter("not today")
        tx.effects.append(event.id)  # rolled back with its transaction

    @property
    def applied(self) -> list[str]:
        """The effects committed, in order."""
        return list(self.store.effects)

    def parked(self) -> list[str]:
        return [
            i for _, i in sorted((seq, i) for i, (_, _, _, seq) in self.store.parked_events.items())
        ]


@pytest.mark.parametrize("batch", [False, True], ids=["per-event", "batch"])
def test_a_dead_letter_parks_its_keys_later_events_and_others_go_on(batch: bool) -> None:
    # Given a handler that parks keys, and a poison event of key k
    orders = Orders(batch=batch)
    orders.poison = {"a1"}
    # When a batch holds it, later events of k, other keys and a keyless event
    first = orders.processor.process(
        [keyed(0, "b0", "j"), keyed(1, "a1", "k"), keyed(2, "b1", "j"), keyed(3, "a2", "k"),
         keyed(4, "c1", None), keyed(5, "a3", "k")]
    )  # fmt: skip
    # Then a1 is dead-lettered, a2 and a3 are parked behind it, the rest applied
    assert first.failure is None and first.next_offset == 6
    assert sorted(orders.applied) == ["b0", "b1", "c1"]
    assert orders.store.status["a1"] == "dead_lettered"
    assert orders.parked() == ["a2", "a3"]
    assert {orders.store.status[i] for i in ("a2", "a3")} == {"parked"}
    assert orders.store.parked_keys == {(TOPIC, b"k"): ("a1", False)}
    # And a later batch parks k's new events too, in order, behind the same dead letter
    orders.processor.process([keyed(6, "a4", "k"), keyed(7, "b2", "j")])
    assert orders.parked() == ["a2", "a3", "a4"]
    assert orders.applied[-1] == "b2"


def test_replaying_the_dead_letter_and_its_released_events_applies_them_in_order() -> None:
    orders = Orders()
    orders.poison = {"a1"}
    orders.processor.process([keyed(0, "a1", "k"), keyed(1, "a2", "k"), keyed(2, "a3", "k")])
    # Given the handler fixed and the key released (its parked events re-published)
    orders.poison = set()
    parked = orders.store.release(TOPIC, b"k")
    replayed_blocker = keyed(3, "a1", "k")._replace(
        headers=[("event-id", b"a1"), (REPLAY_HEADER, b"orders/0/0")]
    )
    # When the dead letter comes back, then the released events, then a new event of k
    result = orders.processor.process([replayed_blocker, *released(parked, 4), keyed(6, "a4", "k")])
    # Then all are applied in offset order, and the key is free again
    assert result.failure is None
    assert orders.applied == ["a1", "a2", "a3", "a4"]
    assert orders.store.parked_events == {} and orders.store.parked_keys == {}
    assert {orders.store.status[i] for i in ("a1", "a2", "a3", "a4")} == {"applied"}


def test_a_released_event_that_fails_again_blocks_its_key_and_the_rest_park_again() -> None:
    orders = Orders()
    orders.poison = {"a1"}
    orders.processor.process([keyed(0, "a1", "k"), keyed(1, "a2", "k"), keyed(2, "a3", "k")])
    # Given a release while a2 still fails
    orders.poison = {"a2"}
    parked = orders.store.release(TOPIC, b"k")
    # When the released events come back without their dead letter replayed
    orders.processor.process(released(parked, 3))
    # Then a2 is dead-lettered and blocks k, a3 waits behind it again
    assert orders.applied == []
    assert orders.store.status["a2"] == "dead_lettered"
    assert orders.store.parked_keys == {(TOPIC, b"k"): ("a2", False)}
    assert orders.parked() == ["a3"]
    assert orders.store.parked_events["a3"][2] is False  # no longer released


def test_key_order_parks_within_a_unit_and_lets_other_keys_run() -> None:
    orders = Orders(ordering="key")
    orders.poison = {"k0"}
    records = [keyed(n, f"{key}{n}", key) for n, key in enumerate("kjkjkj")]
    try:
        result = orders.processor.process(records)
    finally:
        orders.processor.close()
    assert result.failure is None and result.next_offset == 6
    assert sorted(orders.applied) == ["j1", "j3", "j5"]
    assert orders.parked() == ["k2", "k4"]


def test_without_park_keys_a_dead_letter_holds_nothing_back() -> None:
    app = App(group_id="g")

    @app.handler(TOPIC)
    def on_event(event: Event, tx: Any) -> None:
        if event.id == "a1":
            raise DeadLetter("no")
        tx.effects.append(event.id)

    store = FakeStore()
    processor = BatchProcessor(app.routes, store, ["event-id"], publisher=FakePublisher())
    processor.process([keyed(0, "a1", "k"), keyed(1, "a2", "k")])
    assert store.effects == ["a2"] and store.parked_events == {}


def test_park_keys_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="park_keys"):
        App().handler(TOPIC, park_keys="yes")  # type: ignore[arg-type]


def test_a_dead_letter_replayed_and_applied_with_nothing_parked_frees_its_key() -> None:
    orders = Orders()
    orders.poison = {"a1"}
    orders.processor.process([keyed(0, "a1", "k")])
    assert orders.store.parked_keys == {(TOPIC, b"k"): ("a1", False)}
    # When the dead letter is replayed (no release: nothing waits) and applies
    orders.poison = set()
    replayed = keyed(1, "a1", "k")._replace(
        headers=[("event-id", b"a1"), (REPLAY_HEADER, b"orders/0/0")]
    )
    orders.processor.process([replayed, keyed(2, "a2", "k")])
    # Then the key is free at once: a2, after it, is applied too
    assert orders.applied == ["a1", "a2"]
    assert orders.store.parked_keys == {}


def test_a_released_key_whose_last_event_fails_stays_blocked() -> None:
    orders = Orders()
    orders.poison = {"a1"}
    orders.processor.process([keyed(0, "a1", "k"), keyed(1, "a2", "k")])
    orders.poison = {"a2"}
    parked = orders.store.release(TOPIC, b"k")
    orders.processor.process(released(parked, 2))
    assert orders.store.parked_keys == {(TOPIC, b"k"): ("a2", False)}
    orders.processor.process([keyed(3, "a3", "k")])
    assert orders.parked() == ["a3"] and orders.applied == []


def test_a_replayed_dead_letter_that_fails_again_holds_the_events_after_it() -> None:
    orders = Orders()
    orders.poison = {"a1"}
    orders.processor.process([keyed(0, "a1", "k")])
    replayed = keyed(1, "a1", "k")._replace(
        headers=[("event-id", b"a1"), (REPLAY_HEADER, b"orders/0/0")]
    )
    orders.processor.process([replayed, keyed(2, "a2", "k"), keyed(3, "b1", "j")])
    assert orders.applied == ["b1"]
    assert orders.parked() == ["a2"]
    assert orders.store.parked_keys == {(TOPIC, b"k"): ("a1", False)}
