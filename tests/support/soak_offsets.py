"""Invariant 2 watched while the soak churns, in memory bounded by the group's lag.

:class:`OffsetWatch` reads the group's committed offsets from the broker every
``interval`` seconds, then, for each partition whose offset moved forward
since the last reading, the records it passed (a reader tails every
partition and keeps only the records not yet passed), then which of their
ids ``processed_events`` holds. A record below a committed offset whose id
the database does not hold is a violation (docs/design.md invariant 2); so is an
offset that moves back. The offsets are read *before* the database: both only
grow, so what the database lacks at the later read it also lacked when the
offset was seen. Each record is looked up once, when an offset first passes
it, so the watch costs the same in the first minute and the fifth hour.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import psycopg
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from psycopg import sql

MAX_KEPT = 50
"""Violations kept verbatim (the rest are only counted)."""


class OffsetWatch:
    """Checks every committed offset of ``group`` against ``processed_events`` as it moves."""

    def __init__(
        self, bootstrap: str, database_url: str, schema: str, group: str, topics: list[str],
        partitions: int, interval: float = 2.0,
    ) -> None:  # fmt: skip
        self._database_url, self._group, self._interval = database_url, group, interval
        self._query = sql.SQL(
            "SELECT event_id FROM {}.processed_events WHERE consumer = %s AND event_id = ANY(%s)"
        ).format(sql.Identifier(schema))
        self._parts = [TopicPartition(t, p) for t in topics for p in range(partitions)]
        self._offsets = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "enable.auto.commit": False, "log_level": 3})  # fmt: skip
        self._reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{group}-watch",
                                 "enable.auto.commit": False, "log_level": 3,
                                 "queued.max.messages.kbytes": 4096})  # fmt: skip
        self._reader.assign([TopicPartition(t, p, 0) for t, p in self._key_list()])
        self._read: dict[tuple[str, int], int] = {}
        """How far the reader got per partition (next offset)."""
        self._pending: dict[tuple[str, int], deque[tuple[int, str]]] = {}
        """Records read but not yet passed by a committed offset: (offset, id)."""
        self._last: dict[tuple[str, int], int] = {}
        self.violations: list[str] = []
        self.count = 0
        self.samples = 0
        self.checked = 0
        """Records checked (each once)."""
        self._stop = threading.Event()
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="offset-watch", daemon=True)

    def _key_list(self) -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in self._parts]

    def _violate(self, what: str) -> None:
        self.count += 1
        if len(self.violations) < MAX_KEPT:
            self.violations.append(f"+{time.monotonic() - self._began:.1f}s {what}")

    def _read_up_to(self, wanted: dict[tuple[str, int], int], timeout: float = 10.0) -> None:
        """Tail the topics until every partition in ``wanted`` is read up to its offset."""
        deadline = time.monotonic() + timeout
        while any(self._read.get(k, 0) < o for k, o in wanted.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reader behind: {self._read} < {wanted}")
            for msg in self._reader.consume(500, 0.2):
                if msg.error() is not None:
                    continue
                where = (msg.topic() or "", msg.partition() or 0)
                offset = msg.offset() or 0
                self._read[where] = offset + 1
                self._pending.setdefault(where, deque()).append((offset, _event_id(msg)))

    def sample(self) -> None:
        """One reading (skipped quietly while the broker or database cannot answer)."""
        try:
            got = {
                (tp.topic, tp.partition): tp.offset
                for tp in self._offsets.committed(self._parts, timeout=10)
                if tp.offset >= 0
            }
            moved = {k: o for k, o in got.items() if o > self._last.get(k, 0)}
            self._read_up_to(moved)
        except (KafkaException, TimeoutError):
            return
        for key, offset in got.items():
            if offset < self._last.get(key, 0):
                self._violate(f"{key[0]}[{key[1]}]: committed offset went back from "
                              f"{self._last[key]} to {offset}")  # fmt: skip
        passed: list[tuple[str, int, int, str]] = []
        for key, offset in moved.items():
            queue = self._pending.get(key, deque())
            while queue and queue[0][0] < offset:
                record_offset, event_id = queue.popleft()
                passed.append((key[0], key[1], record_offset, event_id))
        ids = sorted({event_id for *_, event_id in passed})
        try:
            with psycopg.connect(self._database_url, autocommit=True) as db:
                done = {row[0] for row in db.execute(self._query, (self._group, ids))}
        except psycopg.Error:
            for topic, partition, record_offset, event_id in reversed(passed):
                self._pending[(topic, partition)].appendleft((record_offset, event_id))
            return
        self.samples += 1
        self.checked += len(passed)
        self._last.update(moved)
        for topic, partition, record_offset, event_id in passed:
            if event_id not in done:
                self._violate(
                    f"{topic}[{partition}] committed at {got[(topic, partition)]} but "
                    f"{event_id!r} at offset {record_offset} is not in processed_events"
                )

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def __enter__(self) -> OffsetWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.sample()  # the final offsets too
        self._offsets.close()
        self._reader.close()


def _event_id(msg: Message) -> str:
    for header in msg.headers() or []:
        if header[0] == "event-id" and isinstance(header[1], bytes):
            return header[1].decode("utf-8", "replace")
    return "?"
