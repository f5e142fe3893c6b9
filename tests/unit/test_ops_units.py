"""The small pieces of the operator commands: durations, member ports, guards, the floor."""

from __future__ import annotations

import pytest

from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError
from kinbox.ops.dedup_window import Guard, floor
from kinbox.ops.status_report import ago

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.42, "0.4s"), (12, "12s"), (303, "5m 3s"), (11_520, "3h 12m"), (1_137_600, "13d 4h")],
)
def test_ages_read_like_a_person_would_say_them(seconds: float, shown: str) -> None:
    assert ago(seconds) == shown


def test_each_member_of_a_worker_gets_its_own_health_port() -> None:
    settings = Settings(database_url="postgresql:///x", group_id="g", health_port=8080)
    assert [settings.for_member(i).health_port for i in range(3)] == [8080, 8081, 8082]
    off = Settings(database_url="postgresql:///x", group_id="g")
    assert off.for_member(2).health_port == 0


def test_the_live_timeout_defaults_to_the_poll_interval_the_consumer_allows() -> None:
    settings = Settings(database_url="postgresql:///x", group_id="g").validate()
    assert settings.effective_live_timeout == 300.0
    overridden = Settings(
        database_url="postgresql:///x",
        group_id="g",
        kafka_overrides={"max.poll.interval.ms": "60000"},
    )
    assert overridden.effective_live_timeout == 60.0
    assert Settings(database_url="x", group_id="g", live_timeout=5).effective_live_timeout == 5
    with pytest.raises(ConfigurationError, match="health_port=70000"):
        Settings(database_url="postgresql:///x", group_id="g", health_port=70000).validate()


def test_the_floor_is_the_guard_that_keeps_rows_longest_forever_first() -> None:
    week = Guard("g", "topic-retention", "t", 604_800.0, "retention.ms=604800000")
    lag = Guard("g", "unconsumed", "-", 60.0, "the oldest record")
    endless = Guard("h", "topic-retention", "u", None, "kept forever")
    assert floor([lag, week]) is week
    assert floor([lag, endless, week]) is endless
    assert floor([]) is None
    assert week.forbids(86_400) and not week.forbids(700_000)
    assert endless.forbids(10**9)
