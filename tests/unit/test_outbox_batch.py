"""Verdicts of a published batch, and how a claim is cut into sends (no services)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from confluent_kafka import KafkaError

from kinbox.core.publisher import ACKED, HELD, Outcome
from kinbox.kafka.deliveries import outcome as _outcome
from producer_outbox.batch import judge, plan
from producer_outbox.config import RelayConfig
from producer_outbox.records import OutboxRow

TOPIC_DOWN = Outcome("UNKNOWN_TOPIC_OR_PART: gone", outage=True, topic_failure=True)
TIMEOUT = Outcome("_MSG_TIMED_OUT: timed out", outage=True)


def _row(key: str | None = "k", attempts: int = 0, topic: str = "t") -> OutboxRow:
    return OutboxRow(str(uuid.uuid4()), 1, topic, key, None, b"{}", {}, attempts)


def test_own_failures_count_and_park_on_the_last_attempt() -> None:
    config = RelayConfig(database_url="x", max_attempts=3)
    ok, first, last = _row("a"), _row("b"), _row("c", attempts=2)
    result = judge([ok, first, last], [ACKED, Outcome("too big"), Outcome("bad")], config)
    assert result.sent == [ok.id]
    by_id = {f.id: f for f in result.failed}
    assert by_id[first.id].counts and not by_id[first.id].park
    assert by_id[first.id].delay == config.backoff(0)
    assert by_id[last.id].counts and by_id[last.id].park


def test_an_outage_neither_counts_nor_parks_and_uses_the_outage_delay() -> None:
    # Given a row that already failed max_attempts - 1 times by its own fault
    config = RelayConfig(database_url="x", max_attempts=3)
    row = _row(attempts=2)
    # When an outage fails it (however long the outage lasts)
    result = judge([row], [TIMEOUT], config, outage_delay=7.0)
    # Then the error is recorded, the attempt is not counted, and it is not parked
    (failure,) = result.failed
    assert (failure.counts, failure.park, failure.delay) == (False, False, 7.0)
    assert failure.error == TIMEOUT.error and result.outages == 1


def test_a_topic_failure_leaves_rows_untouched_and_reports_the_topic() -> None:
    config = RelayConfig(database_url="x", max_attempts=1)
    rows = [_row("a", topic="gone"), _row("b", attempts=5, topic="gone")]
    result = judge(rows, [TOPIC_DOWN, TOPIC_DOWN], config)
    assert result.failed == [] and result.sent == []
    assert result.topics == {"gone": TOPIC_DOWN.error}


def test_a_row_held_behind_its_key_gains_no_attempt() -> None:
    config = RelayConfig(database_url="x", max_attempts=1)
    bad, waiting = _row("k"), _row("k")
    result = judge([bad, waiting], [Outcome("too big"), HELD], config)
    assert [f.id for f in result.failed] == [bad.id]
    assert result.held == 1


def test_an_ack_after_a_failure_of_the_same_key_is_reported_as_an_order_break(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = RelayConfig(database_url="x")
    rows = [_row("k"), _row("k"), _row("other")]
    result = judge(rows, [Outcome("too big"), ACKED, ACKED], config)
    assert result.order_broken == 1
    assert "per-key order broken" in caplog.text


def test_outcomes_classify_topic_and_authorization_errors_as_topic_outages() -> None:
    for code in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    ):
        outcome = _outcome(KafkaError(code))
        assert outcome.topic_failure and outcome.outage, code
    size = _outcome(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert not size.outage and not size.topic_failure
    assert _outcome(KafkaError(KafkaError._MSG_TIMED_OUT)).outage


def _named(name: str, key: str | None, attempts: int = 0, topic: str = "t") -> OutboxRow:
    return OutboxRow(str(uuid.uuid4()), 1, topic, key, None, name.encode(), {}, attempts)


def _names(rows: Sequence[OutboxRow], indexes: list[int]) -> list[str]:
    return [rows[i].value.decode() for i in indexes]


def test_a_row_that_failed_before_goes_alone_and_its_keys_later_rows_wait() -> None:
    # Given fresh rows around a retried row r of key k2
    rows = [
        _named("a", "k1"),
        _named("r", "k2", attempts=1),
        _named("b", "k2"),
        _named("c", "k1"),
        _named("n", None),
    ]
    # When the claim is cut into sends
    cut = plan(rows)
    # Then the fresh rows go together, r alone, and b (behind r) in a later claim
    assert _names(rows, cut.together) == ["a", "c", "n"]
    assert _names(rows, cut.alone) == ["r"] and cut.waiting == []


def test_a_retried_row_behind_a_fresh_row_of_its_key_waits_for_a_later_claim() -> None:
    rows = [_named("a", "k"), _named("r", "k", attempts=2), _named("b", "k")]
    cut = plan(rows)
    # a's outcome decides r's fate: r (and b behind it) stay pending for now
    assert _names(rows, cut.together) == ["a"] and cut.alone == [] and cut.waiting == []


def test_one_row_of_a_topic_goes_alone_at_a_time_and_the_others_wait() -> None:
    rows = [
        _named("r1", "k1", attempts=1),
        _named("r2", "k2", attempts=1),
        _named("u", "k3", attempts=1, topic="u"),
        _named("x", None, attempts=1, topic="x"),
        _named("f", "k4"),
    ]
    cut = plan(rows, alone_topics={"x"})
    assert _names(rows, cut.alone) == ["r1", "u"]
    assert _names(rows, cut.waiting) == ["r2", "x"]  # their topics' slots are taken
    assert _names(rows, cut.together) == ["f"]
