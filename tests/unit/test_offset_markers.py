"""Committed offsets step over transaction markers, and only where nothing is outstanding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.offsets import Offsets
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import TransportError
from kinbox.core.event import Event
from kinbox.testing import FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "payments"
P0 = (T, 0)


def marker_after(transport: FakeTransport, tp: tuple[str, int]) -> None:
    """What librdkafka does when it serves a commit marker: the position steps past it."""
    transport.position[tp] += 1


def subscribed_runner(transport: FakeTransport) -> Runner:
    """A runner of one recording handler on ``T``, subscribed to ``transport``, batches inline."""
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        tx.effects.append(event.id)

    config = Settings(database_url="postgresql:///x", group_id="g").validate()
    runner = Runner(app, config, transport, FakeStore(), executor=InlineExecutor())
    transport.subscribe(app.topics, runner)
    return runner


def test_an_idle_partition_commits_the_position_past_a_marker() -> None:
    transport = FakeTransport({P0: [record(T, 0, o, f"e{o}") for o in range(3)]})
    runner = subscribed_runner(transport)
    runner.turn()
    assert transport.committed == {P0: 3}
    # When the marker at offset 3 is served by a later poll, with no record
    marker_after(transport, P0)
    runner.turn()
    # Then the committed offset reaches the log's end (4), not just last record + 1
    assert transport.committed == {P0: 4}
    calls = len(transport.commit_calls)
    runner.turn()
    assert len(transport.commit_calls) == calls  # nothing new: no commit


def test_a_record_handed_over_but_not_settled_keeps_the_position_back() -> None:
    transport = FakeTransport({P0: [record(T, 0, o, f"e{o}") for o in range(6)]})
    heard = Heard()
    transport.subscribe([T], heard)
    transport.poll(10, 0)  # the consumer's position is 6 now
    offsets = heard.offsets = Offsets(transport)
    offsets.advance(P0, 3)  # only 0..2 settled (3.. put back, or still in flight)
    offsets.commit()
    assert transport.committed == {P0: 3}
    offsets.advance(P0, 6)
    marker_after(transport, P0)
    transport.poll(10, 0)  # the broker's answer to the first commit
    offsets.commit()
    assert transport.committed == {P0: 7}


def test_a_partition_never_settled_is_never_stepped() -> None:
    transport = FakeTransport({P0: [record(T, 0, o, f"e{o}") for o in range(2)]})
    transport.subscribe([T], Heard())
    transport.poll(10, 0)
    offsets = Offsets(transport)
    offsets.commit()
    assert transport.committed == {} and transport.commit_calls == []


class Heard:
    offsets: Offsets | None = None

    def on_assigned(self, partitions: list[tuple[str, int]]) -> None:
        pass

    def on_revoked(self, partitions: list[tuple[str, int]]) -> None:
        pass

    def on_lost(self, partitions: list[tuple[str, int]]) -> None:
        pass

    def on_committed(
        self, offsets: Mapping[tuple[str, int], int], error: TransportError | None
    ) -> None:
        if self.offsets is not None:
            self.offsets.answered(offsets, error)
