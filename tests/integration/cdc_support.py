"""Helpers of the CDC tests: a connector per test on the module's Connect worker, and cleanup."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
from click.testing import CliRunner
from psycopg import sql

from kinbox.cli.outbox import outbox
from kinbox.devstack.connect import KafkaConnect
from producer_outbox.connect_api import ConnectClient, register
from producer_outbox.debezium import DebeziumSettings, connector_config, refuse_bytes_payloads
from producer_outbox.slots import drop_slot

Conn = psycopg.Connection[tuple[Any, ...]]

FAST_CONNECTOR = {
    # Debezium restarts its task this long after a retriable error (a database
    # restart); the default is 10 s.
    "retriable.restart.connector.wait.ms": "1000",
}


@dataclass(frozen=True)
class Cdc:
    """One registered connector: its name, slot and the worker it runs on."""

    connect: KafkaConnect
    name: str
    slot: str
    database_url: str

    def slot_row(self) -> tuple[Any, ...]:
        """``(active, retained bytes, confirmed_flush_lsn, current LSN)`` of the slot."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,"
                " confirmed_flush_lsn, pg_current_wal_lsn()"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (self.slot,),
            ).fetchone()
        assert row is not None, f"slot {self.slot} is gone"
        return tuple(row)

    def wait_running(self, timeout: float = 90.0) -> None:
        """Wait until the connector and its task run again (after a worker restart)."""
        ConnectClient(self.connect.rest_url).wait_running(self.name, timeout=timeout)


def search_path_url(database_url: str, schema: str) -> str:
    """``database_url`` with ``search_path`` = ``schema`` (the example's unqualified tables)."""
    separator = "&" if "?" in database_url else "?"
    return f"{database_url}{separator}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def outbox_connector(
    connect: KafkaConnect,
    database_url: str,
    schema: str,
    *,
    heartbeat_ms: int = 1000,
    header_columns: tuple[str, ...] = (),
    extra: dict[str, str] | None = None,
) -> Iterator[Cdc]:
    """Register a Debezium connector for ``<schema>.outbox``; remove it and its slot afterwards.

    Without ``extra`` settings this is what a user types,
    ``kinbox outbox debezium-config --register URL``; with them, the same
    steps through the library (the command has no flag for every setting).
    """
    suffix = uuid.uuid4().hex[:10]
    settings = DebeziumSettings(
        name=f"cdc-{suffix}",
        topic_prefix=f"cdc{suffix}",
        slot_name=f"kinbox_{suffix}",
        heartbeat_ms=heartbeat_ms,
        # COLUMN[:HEADER], as the command reads it: the header is named after the column.
        header_columns={
            column: header or column
            for column, _, header in (item.partition(":") for item in header_columns)
        },
    )
    cdc = Cdc(connect, settings.name, settings.slot_name, database_url)
    try:
        if extra is None:
            result = CliRunner().invoke(
                outbox,
                ["debezium-config", "--register", connect.rest_url, "--name", settings.name,
                 "--topic-prefix", settings.topic_prefix, "--slot-name", settings.slot_name,
                 "--heartbeat-ms", str(heartbeat_ms), "--timeout", "90",
                 *(arg for column in header_columns for arg in ("--header-column", column))],
                env={"KINBOX_DATABASE_URL": database_url, "KINBOX_SCHEMA": schema},
            )  # fmt: skip
            assert result.exit_code == 0, result.output
            assert "RUNNING, tasks RUNNING" in result.output, result.output
        else:
            connector = connector_config(database_url, schema, settings)
            connector["config"].update(extra)
            with psycopg.connect(database_url, autocommit=True) as conn:
                refuse_bytes_payloads(conn, schema)
            register(connect.rest_url, connector, timeout=90)
        yield cdc
    finally:
        drop(cdc)


def drop(cdc: Cdc) -> None:
    """Delete the connector, then its slot and publication (Debezium keeps both)."""
    if cdc.connect.pid is not None:
        # The worker may be down after a failed test; the slot goes all the same.
        with contextlib.suppress(Exception):
            ConnectClient(cdc.connect.rest_url).delete(cdc.name)
    with psycopg.connect(cdc.database_url, autocommit=True) as conn:
        drop_slot(conn, cdc.slot)
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(cdc.slot)))


def write_wal(conn: Conn, schema: str, megabytes: int) -> None:
    """Write about ``megabytes`` of WAL into a table no connector captures."""
    table = sql.Identifier(schema, "scratch")
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (pad text)").format(table))
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT repeat('x', 1000) FROM generate_series(1, %s)").format(
            table
        ),
        (megabytes * 1000,),
    )
