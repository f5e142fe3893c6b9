"""librdkafka's statistics, read for each assigned partition's lag."""

from __future__ import annotations

import json
import logging

import pytest

from kinbox.core.config import Settings
from kinbox.core.lag import LagBoard
from kinbox.kafka.consumer import consumer_config
from kinbox.kafka.stats import DEFAULT_INTERVAL_MS, lags, on_stats

pytestmark = pytest.mark.unit


def partition(number: int, lag: int, *, desired: bool = True) -> dict[str, object]:
    return {"partition": number, "desired": desired, "consumer_lag": lag, "hi_offset": 10}


def document() -> str:
    parts = [partition(0, 4), partition(1, -1), partition(2, 3, desired=False), partition(-1, 0)]
    return json.dumps(
        {
            "type": "consumer",
            "topics": {
                "orders": {"partitions": {str(p["partition"]): p for p in parts}},
                "other": {"partitions": {"0": partition(0, 0)}},
            },
        }
    )


def test_only_assigned_partitions_with_a_known_lag_are_read() -> None:
    # -1 = unknown (nothing committed yet), not desired = another member's,
    # partition -1 = librdkafka's internal one
    assert lags(document()) == {("orders", 0): 4, ("other", 0): 0}


def test_a_report_that_cannot_be_read_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    board = LagBoard()
    receive = on_stats(board.update)
    receive(document())
    with caplog.at_level(logging.DEBUG, "kinbox.kafka.stats"):
        receive("{not json")
    assert board.read() == {("orders", 0): 4, ("other", 0): 0}
    assert "not understood" in caplog.text


def test_statistics_are_asked_for_only_with_a_board_and_x_overrides_win() -> None:
    settings = Settings(database_url="x", group_id="g")
    assert "stats_cb" not in consumer_config(settings)
    config = consumer_config(settings, LagBoard())
    assert config["statistics.interval.ms"] == DEFAULT_INTERVAL_MS and callable(config["stats_cb"])
    overridden = Settings(
        database_url="x", group_id="g", kafka_overrides={"statistics.interval.ms": "0"}
    )
    assert consumer_config(overridden, LagBoard())["statistics.interval.ms"] == "0"
