"""Content PostgreSQL really refuses, against the real stack (docs/design.md invariant 5).

One test per kind of refusal, wherever it is raised: an event id the claim
cannot store, a handler's value too long for its column or over the btree
index row limit, a deferred constraint that fails only at COMMIT, an
exception whose text holds NUL or lone surrogates, a header name that is not
UTF-8. In each, the records before and after the bad one are applied once,
the bad one is dead-lettered (read back from the dead-letter topic, its
``processed_events`` row ``dead_lettered`` with a reason), and the committed
offset read back from the broker reaches the end of the partition.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from kinbox.app import App
from kinbox.core.errors import DeadLetter
from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import running, statuses
from tests.integration.inbox_support import committed, effects, settings
from tests.integration.refusal_support import (
    dead_letters,
    payload,
    run_to_end,
    with_id,
    write,
)
from tests.support.database import Conn, prepare_schema
from tests.support.waiting import wait_for


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _app(topic: str, schema: str, group: str, write_effect: Any, **route: Any) -> App:
    """``write_effect(event, tx, schema)`` runs first; then one effect row per event."""
    app = App(group_id=group, schema=schema)
    insert = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, 0)"
    ).format(sql.Identifier(schema))

    @app.handler(topic, **route)
    def apply(event: Event, tx: Any) -> None:
        write_effect(event, tx, sql.Identifier(schema))
        tx.execute(insert, (group, event.id, event.topic, event.partition, event.offset))

    return app


def _applied(db: Conn, schema: str) -> list[str]:
    return [row[1] for row in effects(db, schema)]


def test_nul_in_an_event_id_is_a_malformed_id(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    topic, group = make_topic(partitions=1), _group()
    prepare_schema(stack.database_url, schema)
    app = _app(topic, schema, group, lambda e, tx, s: None)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    written = write(
        stack.bootstrap_servers,
        topic,
        [(with_id("e1"), b"{}"), (with_id(b"bad\x00id"), b"{}"), (with_id("e3"), b"{}")],
    )
    assert run_to_end(app, config, written) == {0: 3}
    assert _applied(db, schema) == ["e1", "e3"]
    status, reason = statuses(db, schema, group)[f"{topic}/0/1"]
    assert status == "dead_lettered"
    assert reason is not None and "holds NUL, which PostgreSQL cannot store" in reason
    [letter] = dead_letters(stack.bootstrap_servers, topic)
    assert letter.header("kinbox.dlq.reason") == "invalid-id"
    assert letter.headers[0] == ("event-id", b"bad\x00id")  # the original, untouched


@pytest.fixture
def latin1_url(stack: Stack) -> Any:
    """A database in LATIN1 on the test server: ids it has no code for cannot be stored."""
    name = f"latin1_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
    yield make_conninfo(stack.database_url, dbname=name)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_an_id_the_database_encoding_cannot_store_is_found_by_narrowing(
    stack: Stack, make_topic: MakeTopic, latin1_url: str
) -> None:
    # Given a LATIN1 database and an id with characters LATIN1 has no code for,
    # which the envelope cannot know about: only the claim finds out
    topic, group, schema = make_topic(partitions=1), _group(), "kb_latin1"
    prepare_schema(latin1_url, schema)
    app = _app(topic, schema, group, lambda e, tx, s: None)
    config = settings(stack.bootstrap_servers, latin1_url, group, schema)
    ids = ["e0", "e1", "café", "e3", "日本-4", "e5", "e6"]
    written = write(stack.bootstrap_servers, topic, [(with_id(i), b"{}") for i in ids])
    assert run_to_end(app, config, written) == {0: 7}
    with psycopg.connect(latin1_url, autocommit=True) as db:
        assert _applied(db, schema) == ["e0", "e1", "café", "e3", "e5", "e6"]
        status, reason = statuses(db, schema, group)[f"{topic}/0/4"]
    assert status == "dead_lettered"
    # (the reason is escaped to ASCII: LATIN1 could not hold the id in it either)
    assert reason is not None and reason.startswith("invalid-id: EnvelopeError: event id '\\u65e5")
    [letter] = dead_letters(stack.bootstrap_servers, topic)
    assert letter.header("event-id") == "日本-4"
    assert "cannot be stored" in (letter.header("kinbox.dlq.error.message") or "")


def _columns(db: Conn, schema: str) -> None:
    db.execute(
        sql.SQL(
            "CREATE TABLE {0}.notes (event_id text, short varchar(8), big text);"
            "CREATE INDEX ON {0}.notes (big)"
        ).format(sql.Identifier(schema))
    )


def _write_note(event: Event, tx: Any, schema: sql.Identifier) -> None:
    body = event.json()
    tx.execute(
        sql.SQL("INSERT INTO {}.notes VALUES (%s, %s, %s)").format(schema),
        (event.id, body.get("short"), body.get("big")),
    )


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"short": "far too long for eight"}, "StringDataRightTruncation"),
        # random hex does not compress: the index row stays over btree's 2704 bytes
        ({"big": os.urandom(4000).hex()}, "ProgramLimitExceeded: index row size"),
    ],
    ids=["varchar-too-long", "index-row-over-limit"],
)
def test_a_value_the_handlers_statement_cannot_store_counts_tries(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, bad: dict[str, str], error: str
) -> None:
    topic, group = make_topic(partitions=1), _group()
    prepare_schema(stack.database_url, schema)
    _columns(db, schema)
    app = _app(topic, schema, group, _write_note, max_attempts=2)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    good = {"short": "ok", "big": "small"}
    records = [(with_id(f"e{n}"), payload(**good)) for n in range(5)]
    records[2] = (with_id("bad"), payload(**bad))
    written = write(stack.bootstrap_servers, topic, records)
    assert run_to_end(app, config, written) == {0: 5}
    assert _applied(db, schema) == ["e0", "e1", "e3", "e4"]
    status, reason = statuses(db, schema, group)["bad"]
    assert status == "dead_lettered" and reason is not None and error in reason
    [letter] = dead_letters(stack.bootstrap_servers, topic)
    assert letter.header("kinbox.dlq.attempts") == "2"
    assert letter.header("kinbox.dlq.error.type") == "StoreError"
    assert error in (letter.header("kinbox.dlq.error.message") or "")


def _deferred(db: Conn, schema: str) -> None:
    db.execute(
        sql.SQL(
            "CREATE TABLE {0}.keys (k text UNIQUE DEFERRABLE INITIALLY DEFERRED);"
            "CREATE TABLE {0}.parents (id int PRIMARY KEY);"
            "INSERT INTO {0}.parents VALUES (1);"
            "CREATE TABLE {0}.children (event_id text,"
            " parent int REFERENCES {0}.parents DEFERRABLE INITIALLY DEFERRED)"
        ).format(sql.Identifier(schema))
    )


def _write_deferred(event: Event, tx: Any, schema: sql.Identifier) -> None:
    body = event.json()
    if body.get("poison"):
        raise DeadLetter("poison")
    tx.execute(sql.SQL("INSERT INTO {}.keys VALUES (%s)").format(schema), (body["k"],))
    tx.execute(
        sql.SQL("INSERT INTO {}.children VALUES (%s, %s)").format(schema),
        (event.id, body["parent"]),
    )


@pytest.mark.parametrize(
    ("bad", "error"),
    [({"k": "k1", "parent": 1}, "UniqueViolation"), ({"k": "k9", "parent": 99}, "ForeignKey")],
    ids=["deferred-unique", "deferred-foreign-key"],
)
def test_a_deferred_constraint_that_fails_only_at_commit_is_pinned_on_its_event(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, bad: dict[str, Any], error: str
) -> None:
    # Given effects checked only at COMMIT, and a dead letter in the same batch
    topic, group = make_topic(partitions=1), _group()
    prepare_schema(stack.database_url, schema)
    _deferred(db, schema)
    app = _app(topic, schema, group, _write_deferred, max_attempts=2)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    records = [(with_id(f"e{n}"), payload(k=f"k{n}", parent=1)) for n in range(1, 9)]
    records[2] = (with_id("poison"), payload(poison=True))
    records[4] = (with_id("bad"), payload(**bad))  # k1 is e1's: the first one wins
    written = write(stack.bootstrap_servers, topic, records)
    assert run_to_end(app, config, written) == {0: 8}
    # Then the records before and after it are applied once, and it is dead-lettered
    assert _applied(db, schema) == ["e1", "e2", "e4", "e6", "e7", "e8"]
    status = statuses(db, schema, group)
    assert status["bad"][0] == "dead_lettered" and error in (status["bad"][1] or "")
    assert status["poison"] == (
        "dead_lettered",
        "dead-letter-requested: poison: DeadLetter: poison",
    )
    letters = dead_letters(stack.bootstrap_servers, topic)
    # one dead letter each: the deferred checks ran before the poison's was sent
    assert [(r.header("event-id"), r.header("kinbox.dlq.attempts")) for r in letters] == [
        ("poison", "1"),
        ("bad", "2"),
    ]


def _raise_text(event: Event, tx: Any, schema: sql.Identifier) -> None:
    if event.id == "bad":
        # text from payload bytes: NUL, and lone surrogates from undecodable bytes
        raise ValueError(event.value.decode("utf-8", "surrogateescape"))


def test_an_exception_whose_text_holds_nul_and_surrogates_is_recorded(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    topic, group = make_topic(partitions=1), _group()
    prepare_schema(stack.database_url, schema)
    app = _app(topic, schema, group, _raise_text, max_attempts=2)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    records = [(with_id(f"e{n}"), b"{}") for n in range(3)]
    records[1] = (with_id("bad"), b"amount \x00 caf\xe9 \xff\xfe")
    written = write(stack.bootstrap_servers, topic, records)
    assert run_to_end(app, config, written) == {0: 3}
    assert _applied(db, schema) == ["e0", "e2"]
    status, reason = statuses(db, schema, group)["bad"]
    assert status == "dead_lettered"
    assert reason == "handler-error: ValueError: amount \\x00 caf\\udce9 \\udcff\\udcfe"
    [letter] = dead_letters(stack.bootstrap_servers, topic)
    assert letter.header("kinbox.dlq.error.message") == "amount \\x00 caf\\udce9 \\udcff\\udcfe"
    assert letter.value == b"amount \x00 caf\xe9 \xff\xfe"


def test_a_header_name_that_is_not_utf8_does_not_stop_the_worker(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # confluent-kafka cannot decode such a name: headers() raises SystemError
    topic, group = make_topic(partitions=1), _group()
    prepare_schema(stack.database_url, schema)
    app = _app(topic, schema, group, lambda e, tx, s: None)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    records = [(with_id(f"e{n}"), b"{}") for n in range(3)]
    records[1] = (with_id("e1", (b"\xff\xfe-name", b"v")), b"{}")
    written = write(stack.bootstrap_servers, topic, records)
    assert run_to_end(app, config, written) == {0: 3}
    assert _applied(db, schema) == ["e0", "e2"]
    status, reason = statuses(db, schema, group)[f"{topic}/0/1"]
    assert status == "dead_lettered"
    assert reason is not None and "headers cannot be read: UnicodeDecodeError" in reason
    [letter] = dead_letters(stack.bootstrap_servers, topic)
    # its headers could not be read, so they cannot be forwarded; key and value are
    assert [k for k, _ in letter.headers if not k.startswith("kinbox.dlq.")] == []
    assert letter.value == b"{}"


def test_a_lock_timeout_on_kinbox_claim_is_never_the_events_fault(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # Given another transaction holding an event's processed_events row (the
    # previous owner of the partition, mid-batch), and a worker whose
    # statements give up waiting for a lock after 100 ms, on its last try
    topic, group = make_topic(partitions=1), _group()
    prepare_schema(stack.database_url, schema)
    app = _app(topic, schema, group, lambda e, tx, s: None, max_attempts=1)
    url = make_conninfo(stack.database_url, options="-c lock_timeout=100")
    config = settings(stack.bootstrap_servers, url, group, schema)
    written = write(stack.bootstrap_servers, topic, [(with_id(f"e{n}"), b"{}") for n in range(3)])
    caplog.set_level(logging.ERROR, logger="kinbox.consume.backoff")
    with psycopg.connect(stack.database_url) as holder:
        holder.execute(
            sql.SQL(
                'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset")'
                " VALUES (%s, 'e1', %s, 0, 1)"
            ).format(sql.Identifier(schema)),
            (group, topic),
        )
        with running(app, config):
            # When the worker's claim times out on the held row, again and again
            wait_for(lambda: _timeouts(caplog) >= 3, 60, "three timed-out claims")
            # Then nothing is dead-lettered, and the offset does not move
            assert statuses(db, schema, group) == {}
            assert committed(stack.bootstrap_servers, group, topic, 1).get(0, 0) == 0
            # until the holder rolls back: then every event is applied once
            holder.rollback()
            wait_for(
                lambda: committed(stack.bootstrap_servers, group, topic, 1) == written.ends(), 60
            )
    assert _applied(db, schema) == ["e0", "e1", "e2"]
    assert {s for s, _ in statuses(db, schema, group).values()} == {"applied"}
    assert dead_letters(stack.bootstrap_servers, topic) == []


def _timeouts(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "kinbox.consume.backoff"
        and "store failure" in r.getMessage()
        and "LockNotAvailable" in r.getMessage()
    )
