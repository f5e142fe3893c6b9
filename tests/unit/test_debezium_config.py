"""The Debezium connector configuration and the pieces of the CDC path that need no services."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kinbox.core.errors import ConfigurationError, ConnectorError
from producer_outbox.connect_api import ConnectClient, ConnectorState
from producer_outbox.debezium import (
    EVENT_ROUTER,
    HEADERS_CARRIER,
    HEADERS_TRANSFORM,
    PASSWORD_PLACEHOLDER,
    DebeziumSettings,
    connector_config,
)
from producer_outbox.slots import SlotStatus, parse_size


def config(url: str = "postgresql://app@db:5433/shop", **settings: Any) -> dict[str, str]:
    built = connector_config(url, "app_kinbox", DebeziumSettings(**settings))
    assert built["name"] == settings.get("name", "kinbox-outbox")
    return built["config"]  # type: ignore[no-any-return]


def test_the_router_publishes_rows_like_the_relay() -> None:
    c = config()
    assert c["transforms"] == "outbox,headers"
    assert c["transforms.outbox.type"] == EVENT_ROUTER
    assert c["transforms.outbox.route.by.field"] == "topic"
    assert c["transforms.outbox.route.topic.replacement"] == "${routedByValue}"
    assert c["transforms.outbox.table.field.event.key"] == "aggregateid"
    assert c["transforms.outbox.route.tombstone.on.empty.payload"] == "false"
    assert c["tombstones.on.delete"] == "false"
    # The payload's JSON text is the value: no schema envelope, no re-encoding.
    assert c["value.converter"] == "org.apache.kafka.connect.storage.StringConverter"
    assert c["transforms.outbox.table.expand.json.payload"] == "false"
    placement = c["transforms.outbox.table.fields.additional.placement"].split(",")
    assert "id:header:event-id" in placement
    assert "type:header:ce_type" in placement
    # The trace context enqueue stored: the consumer continues the producer's trace.
    assert "traceparent:header:traceparent" in placement
    assert "tracestate:header:tracestate" in placement
    assert f"headers:header:{HEADERS_CARRIER}" in placement
    assert c["transforms.headers.type"] == HEADERS_TRANSFORM
    assert c["transforms.headers.drop.null"] == "ce_type,traceparent,tracestate"
    assert c["publication.name"] == "kinbox_outbox"
    assert c["publication.autocreate.mode"] == "filtered"
    assert c["snapshot.mode"] == "no_data"
    assert c["predicates.outboxTable.pattern"] == r"kinbox\.app_kinbox\.outbox"


def test_no_password_in_the_url_means_none_in_the_config() -> None:
    assert "database.password" not in config()
    with_password = config("postgresql://app:pw@db/shop")
    assert with_password["database.password"] == PASSWORD_PLACEHOLDER
    assert "pw" not in with_password.values()


def test_the_heartbeat_emits_a_message_the_connector_drops() -> None:
    c = config(heartbeat_ms=5000)
    assert c["heartbeat.interval.ms"] == "5000"
    assert "pg_logical_emit_message(false" in c["heartbeat.action.query"]
    assert c["message.prefix.exclude.list"] == "kinbox-heartbeat"
    assert "heartbeat.interval.ms" not in config(heartbeat_ms=0)


def test_more_columns_become_headers_through_the_hook() -> None:
    c = config(header_columns={"tenant_id": "tenant"})
    placement = c["transforms.outbox.table.fields.additional.placement"].split(",")
    assert "tenant_id:header:tenant" in placement
    assert c["transforms.headers.drop.null"] == "ce_type,traceparent,tracestate,tenant"


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"slot_name": "Bad-Slot"}, "slot_name"),
        ({"publication": "bad;pub"}, "publication"),
        ({"topic_prefix": "a b"}, "topic_prefix"),
        ({"heartbeat_ms": -1}, "heartbeat_ms"),
        ({"header_columns": {"col": "a,b"}}, "header name"),
        ({"header_columns": {"Bad Col": "h"}}, "header column"),
    ],
)
def test_bad_settings_name_the_setting(settings: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigurationError, match=names):
        config(**settings)


def test_bad_schema_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        connector_config("postgresql://x/y", "x; DROP", DebeziumSettings())


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1073741824", 1 << 30), ("512MB", 512 << 20), ("1GiB", 1 << 30), ("64k", 64 << 10)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1", "1X"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def slot(**changes: object) -> SlotStatus:
    values: dict[str, object] = {
        "name": "kinbox_outbox",
        "plugin": "pgoutput",
        "active": False,
        "wal_status": "reserved",
        "retained_bytes": 2048,
        "unconfirmed_bytes": 1024,
        "safe_wal_size": None,
    }
    values.update(changes)
    return SlotStatus(**values)  # type: ignore[arg-type]


def test_slot_warns_past_the_threshold_and_when_lost() -> None:
    assert slot().warning(4096) is None
    warning = slot().warning(1024)
    assert warning is not None and "INACTIVE" in warning and "2.0 KiB" in warning
    lost = slot(wal_status="lost").warning(1 << 40)
    assert lost is not None and "lost" in lost


class ScriptedClient(ConnectClient):
    """A client whose status answers come from a list."""

    def __init__(self, states: list[ConnectorState]) -> None:
        super().__init__("http://127.0.0.1:1")
        self._states: Iterator[ConnectorState] = iter(states)

    def state(self, name: str) -> ConnectorState:
        return next(self._states)


def test_wait_running_returns_once_connector_and_tasks_run() -> None:
    client = ScriptedClient(
        [
            ConnectorState("c", "RUNNING", ()),
            ConnectorState("c", "RUNNING", ("UNASSIGNED",)),
            ConnectorState("c", "RUNNING", ("RUNNING",)),
        ]
    )
    state = client.wait_running("c", sleep=lambda _s: None)
    assert state.running


def test_wait_stopped_returns_once_the_connector_is_stopped() -> None:
    client = ScriptedClient(
        [ConnectorState("c", "RUNNING", ("RUNNING",)), ConnectorState("c", "STOPPED", ())]
    )
    assert client.wait_stopped("c", sleep=lambda _s: None).connector == "STOPPED"


def test_wait_running_ends_at_once_on_failure_with_connects_error() -> None:
    client = ScriptedClient(
        [ConnectorState("c", "RUNNING", ("FAILED",), ("task 0: password authentication failed",))]
    )
    with pytest.raises(ConnectorError, match="password authentication failed"):
        client.wait_running("c", sleep=lambda _s: None)


def test_wait_running_times_out() -> None:
    ticks = iter(range(100))
    client = ScriptedClient([ConnectorState("c", "UNASSIGNED", ())] * 100)
    with pytest.raises(ConnectorError, match="not RUNNING after 5s"):
        client.wait_running("c", timeout=5, clock=lambda: float(next(ticks)), sleep=lambda _s: None)


def test_connect_url_must_be_http() -> None:
    with pytest.raises(ConnectorError, match="http"):
        ConnectClient("127.0.0.1:8083")


def test_database_address_as_connect_sees_it() -> None:
    c = config(database_address="postgres")
    assert (c["database.hostname"], c["database.port"]) == ("postgres", "5432")
    assert config()["database.hostname"] == "db" and config()["database.port"] == "5433"
