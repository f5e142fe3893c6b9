"""`kinbox migrate` against the real server: idempotent, serialised, versioned."""

from __future__ import annotations

import subprocess
import sys

from psycopg import sql

from kinbox.devstack.stack import Stack
from kinbox.store.decisions import CONSOLE
from kinbox.store.schema import INBOX
from producer_outbox.schema import OUTBOX
from tests.support.database import Conn


def _migrate(stack: Stack, schema: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kinbox", "migrate", "--database-url", stack.database_url,
         "--schema", schema],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_concurrent_migrations_apply_each_step_once(stack: Stack, schema: str, db: Conn) -> None:
    # When four processes migrate the same new schema at the same moment
    runs = [_migrate(stack, schema) for _ in range(4)]
    outputs = [run.communicate(timeout=60)[0] for run in runs]

    # Then all succeed, exactly one of them did the work, and the versions are recorded
    assert [run.returncode for run in runs] == [0, 0, 0, 0], outputs
    migrated = [out for out in outputs if f"migrated 0 -> {INBOX.version}" in out]
    assert len(migrated) == 1, outputs
    # inbox, console and outbox lines
    assert sum(out.count("up to date") for out in outputs) == 3 * 3
    versions = db.execute(
        sql.SQL("SELECT component, version FROM {}.schema_version ORDER BY 1").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    assert versions == [
        ("console", CONSOLE.version), ("inbox", INBOX.version), ("outbox", OUTBOX.version),
    ]  # fmt: skip


def test_migrating_again_changes_nothing(stack: Stack, schema: str) -> None:
    first = _migrate(stack, schema).communicate(timeout=60)[0]
    again = _migrate(stack, schema)
    out = again.communicate(timeout=60)[0]
    assert again.returncode == 0
    assert "migrated 0 -> " in first
    assert out.count("up to date") == 3, out
