"""Property: whatever a record holds, it reaches a verdict and its partition its end (invariant 5).

Hypothesis writes records to the real broker — header names and values of
arbitrary bytes, payloads of arbitrary bytes or of JSON with arbitrary
strings, ids that are valid, malformed, or repeats of earlier ones — and a
real worker (real PostgreSQL, real dead-letter topic) consumes them with a
handler that writes values taken from the payload into columns of several
types and constraints: text, ``varchar(16)``, ``integer``, a ``CHECK``, a
btree-indexed column, and a ``UNIQUE DEFERRABLE INITIALLY DEFERRED`` key. Then,
counted in the database and read back from the broker:

- every record ends applied once, a duplicate, or dead-lettered (once, on the
  dead-letter topic, ``dead_lettered`` with a reason), and exactly the one
  predicted from its content;
- no handler ran more than ``max_attempts`` times for an event;
- every partition's committed offset reaches its end offset.

One topic, schema and worker serve every example (a group join per example
would cost more than the example), so each example's ids carry its own tag.
``KINBOX_PROPERTY_EXAMPLES`` sets the number of examples; ``--long`` (or
``KINBOX_FAULTS_LONG=1``) runs many more. The examples are derandomized, so
a CI run is reproducible.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from psycopg import sql

from kinbox.app import App
from kinbox.apply.envelope import event_id
from kinbox.core.config import Settings
from kinbox.core.errors import EnvelopeError
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.devstack.stack import Stack
from tests.integration.failure_support import running
from tests.integration.inbox_support import committed
from tests.support.database import drop_schema, prepare_schema
from tests.support.launch import FAST_GROUP, FAST_TIMINGS, Timings
from tests.support.rawkafka import RawRecord, produce_raw
from tests.support.records import read_topic
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

PARTITIONS = 2
MAX_ATTEMPTS = 2
ID_HEADERS = ("event-id", "ce_id", "id")
BIG = os.urandom(3000).hex()  # incompressible: an index row over btree's limit (54000)


def _examples() -> int:
    configured = os.environ.get("KINBOX_PROPERTY_EXAMPLES")
    if configured:
        return int(configured)
    return 300 if os.environ.get("KINBOX_FAULTS_LONG", "").lower() in {"1", "true", "yes"} else 20


# -- what hypothesis writes ----------------------------------------------------


def mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` most of the time, else ``rare``: most records should be applied."""
    return st.integers(0, 7).flatmap(lambda roll: rare if roll == 7 else usual)


any_text = st.text(st.characters(exclude_categories=()), max_size=24)  # NUL, lone surrogates
plain_text = st.text(max_size=12)
header_name = mostly(
    st.sampled_from([b"trace", b"a\x00b", b"", b"ce_id"]) | plain_text.map(str.encode),
    st.binary(max_size=10),  # often not UTF-8: then no header of the record can be read
)
header_value = st.none() | st.binary(max_size=16)
raw_id = mostly(
    st.text(min_size=1, max_size=16).map(str.encode),  # NUL included: malformed
    st.one_of(
        st.none(),  # no id header at all
        st.binary(max_size=12),  # often not UTF-8, sometimes empty
        st.integers(250, 300).map(lambda n: b"i" * n),  # around the 255-byte limit
        st.just(b"\x00dup"),  # marker: repeat an earlier record of this example
    ),
)
json_body = st.fixed_dictionaries(
    {},
    optional={
        "s": mostly(st.text(), any_text),
        "short": mostly(plain_text, any_text),  # over 16 characters: refused
        "n": mostly(st.integers(-1000, 1000), st.integers(-(2**40), 2**40)),
        "c": mostly(st.integers(0, 3), st.integers(-3, -1)),  # CHECK (c >= 0)
        "k": st.sampled_from(["k1", "k2", "k3"]),  # a deferred unique key
        "big": mostly(st.just("small"), st.just(BIG)),
    },
)
payload = mostly(
    st.tuples(json_body, st.booleans()).map(
        # ensure_ascii=False with a lone surrogate gives bytes that are not UTF-8
        lambda d: json.dumps(d[0], ensure_ascii=d[1]).encode("utf-8", "surrogatepass")
    ),
    st.binary(max_size=40),
)


@dataclass(frozen=True)
class Draft:
    """One record as drawn, before the example's tag is put on its id and key."""

    partition: int
    id_header: str
    raw_id: bytes | None
    extra: list[tuple[bytes, bytes | None]]
    value: bytes


drafts = st.lists(
    st.builds(
        Draft,
        st.integers(0, PARTITIONS - 1),
        st.sampled_from(ID_HEADERS),
        raw_id,
        st.lists(st.tuples(header_name, header_value), max_size=2),
        payload,
    ),
    min_size=1,
    max_size=12,
)


# -- the worker's side ------------------------------------------------------------


@dataclass
class World:
    """The topic, schema and running worker every example shares."""

    bootstrap: str
    database_url: str
    topic: str
    schema: str
    group: str
    calls: list[tuple[str, int]] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)
    examples: Iterator[int] = field(default_factory=itertools.count)


def _create_tables(database_url: str, schema: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {0}.vals (event_id text, s text, short varchar(16), n integer,"
                " c integer CHECK (c >= 0), big text);"
                "CREATE INDEX ON {0}.vals (big);"
                "CREATE TABLE {0}.keys (k text UNIQUE DEFERRABLE INITIALLY DEFERRED)"
            ).format(sql.Identifier(schema))
        )


def _app(world: World) -> App:
    app = App(group_id=world.group, schema=world.schema)
    schema = sql.Identifier(world.schema)
    vals = sql.SQL("INSERT INTO {}.vals VALUES (%s, %s, %s, %s, %s, %s)").format(schema)
    keys = sql.SQL("INSERT INTO {}.keys VALUES (%s)").format(schema)
    effect = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, 0)"
    ).format(schema)

    @app.handler(world.topic, max_attempts=MAX_ATTEMPTS)
    def apply(event: Event, tx: Any) -> None:
        world.calls.append((event.id, event.attempt))
        body = event.json()
        if not isinstance(body, dict):
            raise ValueError(f"not a JSON object: {body!r}")
        fields = [body.get(name) for name in ("s", "short", "n", "c", "big")]
        tx.execute(vals, (event.id, *fields))
        if "k" in body:
            tx.execute(keys, (body["k"],))
        tx.execute(effect, (world.group, event.id, event.topic, event.partition, event.offset))

    return app


@pytest.fixture(scope="class")
def world(stack: Stack) -> Iterator[World]:
    """One topic, schema and group, and a worker running over them for the whole class."""
    tag = uuid.uuid4().hex[:10]
    world = World(
        stack.bootstrap_servers, stack.database_url, f"prop-{tag}", f"prop_{tag}", f"g-{tag}"
    )
    create_topic(world.bootstrap, world.topic, PARTITIONS)
    prepare_schema(world.database_url, world.schema)
    _create_tables(world.database_url, world.schema)
    timings: Timings = {**FAST_TIMINGS, "retry_initial": 0.05, "retry_max": 0.2}
    config = Settings(
        bootstrap_servers=world.bootstrap, database_url=world.database_url,
        group_id=world.group, schema=world.schema,
        **timings,
        kafka_overrides=dict(FAST_GROUP),
        id_headers=ID_HEADERS,  # all three, `id` included: the records use each
    ).validate()  # fmt: skip
    try:
        with running(_app(world), config):
            yield world
    finally:
        drop_schema(world.database_url, world.schema)
        admin = AdminClient({"bootstrap.servers": world.bootstrap})
        for future in admin.delete_topics([world.topic, f"{world.topic}.dlq"]).values():
            with contextlib.suppress(KafkaException):  # no dead letter: no topic
                future.result(timeout=30)


# -- what must happen to each record --------------------------------------------


def _visible_headers(
    raw: list[tuple[bytes, bytes | None]],
) -> list[tuple[str, bytes | None]] | None:
    """The headers as the consumer sees them, or ``None`` if it cannot read them.

    librdkafka hands names over as C strings (a NUL ends one) and
    confluent-kafka decodes them as UTF-8; one that is not makes them all
    unreadable.
    """
    out = []
    for name, value in raw:
        try:
            out.append((name.split(b"\x00")[0].decode("utf-8"), value))
        except UnicodeDecodeError:
            return None
    return out


TYPES = {"s": str, "short": str, "n": int, "c": int, "k": str, "big": str}


def _doomed(value: bytes) -> bool | None:
    """Whether this payload's effect is refused whatever else happens (so dead-lettered).

    ``None``: not predicted (a JSON object with fields of other types, which
    only random bytes could produce); then any verdict will do.
    """
    try:
        body = json.loads(value)
    except ValueError:
        return True
    if not isinstance(body, dict):
        return True
    if any(not isinstance(body[k], t) or isinstance(body[k], bool) for k, t in TYPES.items()
           if k in body):  # fmt: skip
        return None
    for name in ("s", "short"):
        text = body.get(name, "")
        if "\x00" in text or not _utf8(text):
            return True
    return (
        len(body.get("short", "")) > 16
        or not -(2**31) <= body.get("n", 0) < 2**31
        or body.get("c", 0) < 0
        or body.get("big") == BIG
    )


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class Expected:
    """What the example must end with, keyed by the id kinbox records."""

    applied: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    either: set[str] = field(default_factory=set)  # not predicted: applied or dead-lettered
    invalid: set[str] = field(default_factory=set)  # derived ids, dead-lettered
    groups: dict[str, set[str]] = field(default_factory=dict)  # unique key -> ids racing for it
    positions: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def _expect(world: World, tagged: list[RawRecord], offsets: list[int]) -> Expected:
    expected = Expected()
    for record, offset in zip(tagged, offsets, strict=True):
        where = (record.partition, offset)
        headers = _visible_headers(list(record.headers))
        kinbox_record = Record(
            world.topic, record.partition, offset, None, record.value, headers or [], None,
            headers_error=None if headers is not None else "unreadable",
        )  # fmt: skip
        try:
            eid = event_id(kinbox_record, ID_HEADERS)
        except EnvelopeError:
            expected.invalid.add(f"{world.topic}/{record.partition}/{offset}")
            continue
        positions = expected.positions.setdefault(eid, [])
        positions.append(where)
        if len(positions) > 1:
            continue  # a duplicate: whichever copy comes first decides (same payload)
        value = record.value or b""
        doomed = _doomed(value)
        if doomed is None:
            expected.either.add(eid)
            continue
        if doomed:
            expected.dead.add(eid)
            continue
        key = json.loads(value).get("k")
        if key is None:
            expected.applied.add(eid)
        else:
            expected.groups.setdefault(key, set()).add(eid)
    return expected


def _tagged(drafts: list[Draft], tag: str) -> list[RawRecord]:
    """The records to write: ids and unique keys carry the example's tag; dups repeat."""
    out: list[RawRecord] = []
    for draft in drafts:
        if draft.raw_id == b"\x00dup" and out:
            earlier = out[len(out) // 2]
            out.append(RawRecord(draft.partition, earlier.value, earlier.headers))
            continue
        headers = list(draft.extra)
        if draft.raw_id not in (None, b"\x00dup"):
            raw = draft.raw_id if draft.raw_id == b"" else tag.encode() + draft.raw_id
            headers.insert(len(headers) // 2, (draft.id_header.encode(), raw))
        value = draft.value
        if value.startswith(b"{"):
            try:
                body = json.loads(value)
                if isinstance(body, dict) and "k" in body:
                    body["k"] = f"{tag}{body['k']}"
                    value = json.dumps(body).encode()
            except ValueError:
                pass
        out.append(RawRecord(draft.partition, value, headers))
    return out


def _statuses(world: World) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(world.database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT event_id, status, reason FROM {}.processed_events WHERE consumer = %s"
            ).format(sql.Identifier(world.schema)),
            (world.group,),
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _effects(world: World) -> Counter[str]:
    with psycopg.connect(world.database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT event_id FROM {}.effects").format(sql.Identifier(world.schema))
        ).fetchall()
    return Counter(r[0] for r in rows)


class TestEveryRecordReachesAVerdict:
    """Arbitrary records against the real stack: applied, a duplicate, or dead-lettered."""

    @settings(
        max_examples=_examples(),
        # No shrinking: each step would run the real stack again, for minutes;
        # the failing example is reported as generated.
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(drafts=drafts)
    def test_every_record_reaches_a_verdict_and_every_partition_its_end(
        self, world: World, drafts: list[Draft]
    ) -> None:
        tag = f"x{next(world.examples)}-"
        records = _tagged(drafts, tag)
        offsets = produce_raw(world.bootstrap, world.topic, records)
        for record, offset in zip(records, offsets, strict=True):
            world.ends[record.partition] = max(world.ends.get(record.partition, 0), offset + 1)
        expected = _expect(world, records, offsets)
        ends = dict(world.ends)
        for name in ("applied", "dead", "invalid", "either", "groups"):
            if getattr(expected, name):
                event(f"has {name}")
        if any(len(places) > 1 for places in expected.positions.values()):
            event("has duplicates")
        if any(_visible_headers(list(r.headers)) is None for r in records):
            event("has unreadable headers")

        # When the worker has had them: every partition's committed offset reaches its end
        def at_end() -> bool:
            got = committed(world.bootstrap, world.group, world.topic, PARTITIONS)
            return all(got.get(p, 0) >= end for p, end in ends.items())

        wait_for(at_end, 60, f"committed offsets to reach {ends}")

        # Then each record has the verdict its content calls for
        status, effects = _statuses(world), _effects(world)
        for eid in expected.applied:
            assert status.get(eid) == ("applied", None), (eid, status.get(eid))
            assert effects[eid] == 1, (eid, effects[eid])
        for eid in expected.dead | expected.invalid:
            assert status.get(eid, ("?",))[0] == "dead_lettered", (eid, status.get(eid))
            assert status[eid][1], f"{eid!r} dead-lettered without a reason"
            assert effects[eid] == 0, (eid, effects[eid])
        for eid in expected.either:
            verdict = status.get(eid, ("?",))[0]
            assert verdict in {"applied", "dead_lettered"}, (eid, status.get(eid))
            assert effects[eid] == (1 if verdict == "applied" else 0), (eid, effects[eid])
        for key, ids in expected.groups.items():
            # a deferred unique key: the first to commit wins, the others are refused
            won = [i for i in ids if status.get(i, ("?",))[0] == "applied"]
            assert len(won) == 1, (key, {i: status.get(i) for i in ids})
            assert all(effects[i] == (1 if i in won else 0) for i in ids)
            assert all(status.get(i, ("?",))[0] == "dead_lettered" for i in ids - set(won))
        # and each dead-lettered event is on the dead-letter topic exactly once
        mine = {(p, o) for p, o in zip((r.partition for r in records), offsets, strict=True)}
        letters = Counter(
            (int(letter.header("kinbox.dlq.partition") or -1),
             int(letter.header("kinbox.dlq.offset") or -1))
            for letter in read_topic(world.bootstrap, f"{world.topic}.dlq")
            if letter.header("kinbox.dlq.topic") == world.topic
        )  # fmt: skip
        letters = Counter({where: n for where, n in letters.items() if where in mine})
        assert all(n == 1 for n in letters.values()), letters
        dead = {i for i, (s, _) in status.items() if s == "dead_lettered" and i.startswith(tag)}
        dead_invalid = {i for i in expected.invalid if status.get(i, ("?",))[0] == "dead_lettered"}
        per_id = {eid: sum(letters[where] for where in expected.positions[eid]) for eid in dead}
        assert all(n == 1 for n in per_id.values()), per_id
        assert len(letters) == len(dead) + len(dead_invalid), (letters, dead, dead_invalid)
        # within a bounded number of tries
        assert all(attempt <= MAX_ATTEMPTS for _, attempt in world.calls), world.calls[-20:]
