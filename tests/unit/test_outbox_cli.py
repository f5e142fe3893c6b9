from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kinbox.cli.outbox import outbox
from kinbox.core.config import redact_url
from kinbox.core.errors import StoreError
from producer_outbox import database


@pytest.mark.parametrize("command", ["relay", "status", "requeue", "cleanup", "debezium-config"])
def test_every_command_has_help(command: str) -> None:
    result = CliRunner().invoke(outbox, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--database-url" in result.output


def test_status_refuses_a_size_that_is_not_one() -> None:
    result = CliRunner().invoke(
        outbox, ["status", "--database-url", "postgresql://x/y", "--slot-warn-bytes", "lots"]
    )
    assert result.exit_code == 2
    assert "not a size" in result.output


def test_debezium_config_matches_the_table_and_hides_the_password() -> None:
    result = CliRunner().invoke(
        outbox,
        ["debezium-config", "--schema", "app_kinbox"],
        env={"KINBOX_DATABASE_URL": "postgresql://app:s3cret@db.example:6543/shop"},
    )
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output
    config = json.loads(result.output)["config"]
    assert config["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    # A regex in Debezium: the dot is escaped, so no other table can match.
    assert config["table.include.list"] == r"app_kinbox\.outbox"
    assert config["database.password"] == "${env:KINBOX_DEBEZIUM_DATABASE_PASSWORD}"
    assert config["database.hostname"] == "db.example" and config["database.port"] == "6543"
    assert config["transforms.outbox.table.field.event.id"] == "id"
    assert config["transforms.outbox.table.field.event.key"] == "aggregateid"
    assert config["transforms.outbox.route.by.field"] == "topic"


def test_bad_schema_is_a_configuration_error_with_exit_code_2() -> None:
    result = CliRunner().invoke(
        outbox, ["debezium-config", "--schema", "Bad;", "--database-url", "postgresql://x/y"]
    )
    assert result.exit_code == 2
    assert "schema='Bad;'" in result.output


def test_relay_refuses_non_idempotent_override() -> None:
    result = CliRunner().invoke(
        outbox,
        ["relay", "--database-url", "postgresql://x/y", "-X", "enable.idempotence=false"],
    )
    assert result.exit_code == 2
    assert "enable.idempotence" in result.output


def test_unreachable_database_exits_3_without_the_password() -> None:
    result = CliRunner().invoke(
        outbox, ["status", "--database-url", "postgresql://u:hunter2@127.0.0.1:1/db"]
    )
    assert result.exit_code == 3
    assert "hunter2" not in result.output


def test_a_failed_connect_is_judged_as_the_inbox_judges_it() -> None:
    # No server answers on port 1: an outage, so worth a retry.
    with pytest.raises(StoreError) as caught:
        database.connect("postgresql://u@127.0.0.1:1/db", "kinbox")
    assert caught.value.transient
    assert str(caught.value).startswith("OperationalError: connection failed")


def test_redact_masks_url_and_conninfo_passwords() -> None:
    assert redact_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert "pw" not in redact_url("host=h password=pw dbname=d")


@pytest.mark.parametrize(
    "choice", [[], ["--all", "--key", "k"], ["--id", "not-a-uuid"], ["--key", "k", "--all"]]
)
def test_requeue_needs_exactly_one_valid_choice(choice: list[str]) -> None:
    result = CliRunner().invoke(
        outbox, ["requeue", "--database-url", "postgresql://u@127.0.0.1:1/db", *choice]
    )
    assert result.exit_code == 2, result.output
