"""Helpers for the tests of content PostgreSQL refuses: write records, run to the end, read back.

Records are written with :func:`tests.support.rawkafka.produce_raw`, so header
names may be any bytes; a worker (real broker, real PostgreSQL, real
dead-letter publisher) runs until the group's committed offsets, read back
from the broker, reach the end of every partition written to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kinbox.app import App
from kinbox.core.config import Settings
from tests.integration.failure_support import running
from tests.integration.inbox_support import committed
from tests.support.rawkafka import RawHeaders, RawRecord, produce_raw
from tests.support.records import Read, read_topic
from tests.support.waiting import wait_for


@dataclass(frozen=True)
class Written:
    """Records as written: (partition, offset) of each, in the order given."""

    topic: str
    places: list[tuple[int, int]]

    def ends(self) -> dict[int, int]:
        """Next offset after the last record, per partition written to."""
        out: dict[int, int] = {}
        for partition, offset in self.places:
            out[partition] = max(out.get(partition, 0), offset + 1)
        return out


def payload(**fields: Any) -> bytes:
    """A JSON payload."""
    return json.dumps(fields).encode()


def with_id(event_id: bytes | str, *extra: tuple[bytes, bytes | None]) -> RawHeaders:
    """Headers carrying ``event_id`` in ``event-id``, then ``extra``."""
    raw = event_id.encode() if isinstance(event_id, str) else event_id
    return [(b"event-id", raw), *extra]


def write(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[RawHeaders, bytes | None]],
    partition: int = 0,
) -> Written:
    """Write ``(headers, value)`` records to one partition, in order."""
    raw = [RawRecord(partition, value, headers) for headers, value in records]
    offsets = produce_raw(bootstrap, topic, raw)
    return Written(topic, [(partition, offset) for offset in offsets])


def run_to_end(
    app: App, config: Settings, written: Written, partitions: int = 1, timeout: float = 90
) -> dict[int, int]:
    """Run a worker until every partition's committed offset reaches its end; return them."""
    ends = written.ends()
    group, topic, bootstrap = config.group_id, written.topic, config.bootstrap_servers

    def done() -> bool:
        got = committed(bootstrap, group, topic, partitions)
        return all(got.get(p, 0) >= end for p, end in ends.items())

    with running(app, config):
        wait_for(done, timeout, f"committed offsets of {group} to reach {ends}")
    return committed(bootstrap, group, topic, partitions)


def dead_letters(bootstrap: str, topic: str) -> list[Read]:
    """The records of ``<topic>.dlq``, ordered by their original offset."""
    letters = read_topic(bootstrap, f"{topic}.dlq")
    return sorted(letters, key=lambda r: int(r.header("kinbox.dlq.offset") or -1))
