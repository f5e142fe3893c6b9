"""Group members joining and leaving mid-stream: every effect once, order kept per partition."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from typing import Any

import pytest

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.inbox_support import (
    Produced,
    assert_offsets_not_ahead,
    committed,
    effects,
    produce,
    start_worker,
)
from tests.support.database import Conn, prepare_schema
from tests.support.launch import FAST_GROUP
from tests.support.waiting import wait_for

PARTITIONS = 6
BATCH = 60
"""Events the stream writes every :data:`PACE` seconds."""
PACE = 0.1
AFTER_LEAVING = 300
"""Events the stream still writes once the third member has left."""
MOST_EVENTS = 30_000
"""A bound on the stream: a member that never joins fails the wait, not the machine."""

PROTOCOLS = {
    "cooperative-sticky": FAST_GROUP,
    "eager": {**FAST_GROUP, "partition.assignment.strategy": "range"},
    "kip848": {"group.protocol": "consumer"},
}


class Stream:
    """A steady stream of events in a thread, until :meth:`stop`; ids ``e0``, ``e1``, ...

    It runs for as long as the story needs rather than for a fixed count: a
    member that takes long to start on a busy machine must still find events
    flowing when it joins and when it leaves.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.produced: Produced = {}
        self._bootstrap, self._topic = bootstrap, topic
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        """Events written (acknowledged) so far; raises what the stream failed with."""
        if self._error is not None:
            raise AssertionError(f"the stream failed: {self._error!r}") from self._error
        return len(self.produced)

    def _run(self) -> None:
        try:
            for start in range(0, MOST_EVENTS, BATCH):
                if self._stop.is_set():
                    return
                batch = [(f"e{i}", i % PARTITIONS) for i in range(start, start + BATCH)]
                produce(self._bootstrap, self._topic, batch, self.produced)
                time.sleep(PACE)
            raise AssertionError(f"the story did not end within {MOST_EVENTS} events")
        except BaseException as exc:
            self._error = exc

    def stop(self) -> int:
        """End the stream; return how many events it wrote."""
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the stream did not stop"
        return self.count


def _workers_applying(db: Conn, schema: str) -> set[int]:
    """Pids of the processes that have applied an event so far."""
    return {row[4] for row in effects(db, schema)}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_third_member_joins_and_leaves_mid_stream(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, protocol: str
) -> None:
    topic = make_topic(partitions=PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    addr = (stack.bootstrap_servers, stack.database_url, topic, group, schema)
    options: dict[str, Any] = {"sleep": 0.002, "kafka": PROTOCOLS[protocol]}

    # Given two members (one process running two) sharing a steady stream of events
    members = start_worker(*addr, processes=2, **options)
    stream = Stream(stack.bootstrap_servers, topic)
    third: subprocess.Popen[bytes] | None = None
    try:
        # Each step waits for the group to get there, never for a fixed time: on
        # a busy machine a member takes many seconds to start and join.
        wait_for(
            lambda: stream.count > 0 and len(_workers_applying(db, schema)) >= 2,
            timeout=120, what="both first members applying events",
        )  # fmt: skip
        # When a third member joins mid-stream, takes part, ...
        third = start_worker(*addr, **options)
        wait_for(
            lambda: stream.count > 0 and third.pid in _workers_applying(db, schema),
            timeout=120, what="the third member applying events",
        )  # fmt: skip
        # ... and leaves while the stream goes on
        third.send_signal(signal.SIGTERM)
        assert third.wait(60) == 0, "the third member did not leave cleanly"
        left_at = stream.count
        wait_for(
            lambda: stream.count >= left_at + AFTER_LEAVING,
            timeout=120, what="the stream going on after the third member left",
        )  # fmt: skip
        events = stream.stop()
        wait_for(
            lambda: (
                sum(committed(stack.bootstrap_servers, group, topic, PARTITIONS).values()) == events
            ),
            timeout=120,
            what="every offset committed",
        )
    finally:
        stream.stop()
        if third is not None and third.poll() is None:
            third.kill()  # a failed wait: never leave the member running
            third.wait(10)
        members.send_signal(signal.SIGTERM)
        assert members.wait(60) == 0

    rows = effects(db, schema)
    # Then every event's effect happened exactly once
    assert len(rows) == events
    assert {row[1] for row in rows} == {f"e{i}" for i in range(events)}
    # and, per partition, effects were applied in offset order
    for partition in range(PARTITIONS):
        offsets = [row[3] for row in rows if row[2] == partition]
        assert offsets == sorted(offsets), f"partition {partition} applied out of order"
    # and the work was really shared (the third member took part)
    assert len({row[4] for row in rows}) >= 3
    assert_offsets_not_ahead(
        db, schema, stack.bootstrap_servers, group, topic, PARTITIONS, stream.produced
    )
