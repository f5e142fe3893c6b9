from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from kinbox.core.errors import ConfigurationError
from kinbox.core.publisher import ACKED, HELD, OutgoingRecord, Sending
from kinbox.kafka.publisher import KafkaPublisher
from producer_outbox.config import RelayConfig
from producer_outbox.group import LaneGroup
from producer_outbox.group import _gone as upkeep_passes
from producer_outbox.lane_locks import group_target
from producer_outbox.producer import producer_config, relay_publisher
from producer_outbox.records import OutboxRow, row_from_db, to_record
from producer_outbox.relay import Relay
from producer_outbox.shared import Shared


def _row(
    attempts: int = 0, key: str | None = "k", event_type: str | None = None, topic: str = "t"
) -> OutboxRow:
    return OutboxRow(str(uuid.uuid4()), 1, topic, key, event_type, b"{}", {"h": "v"}, attempts)


def test_backoff_is_exponential_and_capped() -> None:
    config = RelayConfig(database_url="x", backoff_base=0.5, backoff_max=4.0)
    assert [config.backoff(n) for n in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]


@pytest.mark.parametrize(
    "bad",
    [
        {"lanes": 0},
        {"batch_size": 0},
        {"poll_interval": 0},
        {"max_attempts": 0},
        {"schema": "x-y"},
        {"retention": timedelta(-1)},
        {"database_url": ""},
    ],
)
def test_config_validation_names_the_setting(bad: dict[str, object]) -> None:
    settings: dict[str, object] = {"database_url": "postgresql://x"}
    settings.update(bad)
    with pytest.raises(ConfigurationError, match=next(iter(bad))):
        RelayConfig(**settings).validate()  # type: ignore[arg-type]


def test_record_has_event_id_cloudevents_and_stored_headers() -> None:
    row = _row(event_type="lesson.completed")
    record = to_record(row)
    headers = dict(record.headers)
    assert headers["event-id"] == headers["ce_id"] == row.id.encode()
    assert headers["ce_type"] == b"lesson.completed"
    assert headers["ce_source"] == b"/t" and headers["ce_specversion"] == b"1.0"
    assert headers["h"] == b"v" and record.key == b"k"
    assert "ce_id" not in dict(to_record(_row()).headers)
    assert to_record(_row(key=None)).key is None


def test_row_from_db_prefers_bytes_and_defaults_null() -> None:
    i = uuid.uuid4()
    assert row_from_db((i, 1, "t", None, None, None, b"\x00", {}, 0)).value == b"\x00"
    assert row_from_db((i, 1, "t", None, None, '{"a": 1}', None, None, 0)).value == b'{"a": 1}'
    assert row_from_db((i, 1, "t", None, None, None, None, None, 0)).value == b"null"


def test_producer_config_keeps_idempotence() -> None:
    config = producer_config("b:9092", {"linger.ms": "7"})
    assert config["enable.idempotence"] == "true" and config["linger.ms"] == "7"
    with pytest.raises(ConfigurationError, match=r"enable\.idempotence"):
        producer_config("b:9092", {"enable.idempotence": "false"})


def test_unreachable_broker_is_an_outage_not_a_bad_record() -> None:
    publisher = relay_publisher(
        producer_config("127.0.0.1:1", {"message.timeout.ms": "300", "log_level": "0"})
    )
    (outcome,) = publisher.publish([OutgoingRecord("t", b"k", b"v", [])])
    assert not outcome.ok and outcome.outage


def test_refused_record_holds_back_later_records_of_its_key() -> None:
    publisher = relay_publisher(
        producer_config(
            "127.0.0.1:1",
            {"message.timeout.ms": "300", "message.max.bytes": "1000", "log_level": "0"},
        )
    )
    big, same_key, same_key_elsewhere, other = (
        OutgoingRecord("t", b"k", b"x" * 5000, []),
        OutgoingRecord("t", b"k", b"v", []),
        OutgoingRecord("t2", b"k", b"v", []),
        OutgoingRecord("t", b"o", b"x" * 5000, []),
    )
    outcomes = publisher.publish([big, same_key, same_key_elsewhere, other])
    assert not outcomes[0].outage and "SIZE" in (outcomes[0].error or "")
    assert outcomes[1] is HELD, "waits behind its key without counting as an attempt"
    assert outcomes[2] is HELD, "a key's order spans topics"
    assert "SIZE" in (outcomes[3].error or "")


class _Unanswered:
    """A producer whose cluster never answers a question about a topic, and acks every record."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.asked: list[str] = []
        self._reports: list[Any] = []

    def list_topics(self, topic: str, timeout: float = -1) -> Any:
        self.asked.append(topic)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def produce(self, topic: str, **kw: Any) -> None:
        self._reports.append(kw["on_delivery"])

    def poll(self, timeout: float = -1) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report(None, None)
        return len(reports)


def test_a_topic_the_cluster_does_not_answer_about_is_not_asked_about_at_every_send() -> None:
    # Given a relay's publisher whose question about a new topic goes unanswered
    # (the broker asked is frozen: the lane group waits for the answer)
    made: list[_Unanswered] = []

    def factory(config: dict[str, Any]) -> Any:
        made.append(_Unanswered(config))
        return made[-1]

    publisher = relay_publisher(producer_config("b:9092", {}), factory=factory, admin_factory=None)
    # When two sends go to that topic
    first = publisher.publish([OutgoingRecord("t", b"k", b"1", [])])
    second = publisher.publish([OutgoingRecord("t", b"o", b"2", [])])
    # Then both are delivered, and the group waited for the question only once
    assert first == second == [ACKED]
    assert made[0].asked == ["t"]


class _Unused:
    """A publisher without siblings, which a test never reaches."""

    def send(self, messages: Sequence[OutgoingRecord]) -> Sending:
        raise AssertionError("not called")

    def serve(self, timeout: float) -> None:
        raise AssertionError("not called")

    def close(self) -> None:
        pass


def test_relay_runs_lane_groups_only_with_a_publisher_that_has_siblings() -> None:
    config = RelayConfig(database_url="postgresql://x", parallel=4)
    assert Relay(config, _Unused()).groups == 1
    kafka = relay_publisher(producer_config("127.0.0.1:1", {"log_level": "0"}))
    assert Relay(config, kafka).groups == 4
    assert Relay(replace(config, lanes=3), kafka).groups == 3
    assert Relay(replace(config, parallel=1), kafka).groups == 1
    assert isinstance(kafka.sibling(), KafkaPublisher)


@pytest.mark.parametrize(("share", "groups"), [(16, 2), (5, 2), (1, 2), (7, 3), (0, 2)])
def test_a_relays_share_of_lanes_splits_evenly_over_its_groups(share: int, groups: int) -> None:
    targets = [group_target(share, group, groups) for group in range(groups)]
    assert sum(targets) == share and max(targets) - min(targets) <= 1


class _Observer:
    def __init__(self) -> None:
        self.turns = 0
        self.held: list[int] = []

    def turned(self) -> None:
        self.turns += 1

    def holding(self, count: int) -> None:
        self.held.append(count)


def test_the_relay_turns_only_once_every_lane_group_turned() -> None:
    observer = _Observer()
    shared = Shared(2, observer)
    # A group that turns again and again while the other is stuck: no turn.
    for _ in range(5):
        shared.turned(0)
    assert observer.turns == 0
    shared.turned(1)
    assert observer.turns == 1
    shared.turned(1)
    assert observer.turns == 1


def test_the_relay_holds_the_lanes_of_all_its_groups() -> None:
    observer = _Observer()
    shared = Shared(2, observer)
    shared.holding(0, 5)
    shared.holding(1, 3)
    shared.holding(0, 0)  # group 0 lost its connection
    assert observer.held == [5, 8, 3]


def test_a_lane_group_reconnects_after_an_outage_a_conflict_or_a_timeout_and_stops_on_a_fault(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given PostgreSQL failing one way at each connect: whose fault it is, as
    # kinbox judges its own statements, decides between a reconnect and a stop
    met = [
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
        psycopg.errors.UndefinedTable('relation "kinbox.outbox" does not exist'),
        AssertionError("not reached"),
    ]
    tried: list[BaseException] = []

    def connect() -> Any:
        tried.append(met[len(tried)])
        raise tried[-1]

    config = RelayConfig(database_url="postgresql://x", backoff_base=0.001, backoff_max=0.001)
    group = LaneGroup(config, _Unused(), connect)
    # When it runs, then it reconnects five times and stops at the missing table
    with caplog.at_level(logging.WARNING), pytest.raises(psycopg.errors.UndefinedTable):
        group.run()
    assert tried == met[:6]
    warned = [r.getMessage() for r in caplog.records if "reconnecting" in r.getMessage()]
    assert len(warned) == 5
    assert "conflict" in warned[2] and "waited too long" in warned[3]


@pytest.mark.parametrize(
    ("raised", "gone"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.ReadOnlySqlTransaction("read-only transaction"), True),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.errors.QueryCanceled("statement timeout"), False),
        (psycopg.errors.UndefinedTable("no outbox"), False),
        (RuntimeError("a bug in a task"), False),
    ],
)
def test_an_upkeep_task_ends_the_connection_only_when_postgresql_is_gone(
    raised: Exception, gone: bool
) -> None:
    # A conflict or a timeout in the cleanup is tried again at its next
    # interval on the same connection; an outage reconnects the group.
    assert upkeep_passes(raised) is gone
