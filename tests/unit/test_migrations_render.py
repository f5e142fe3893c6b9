from __future__ import annotations

import pytest
from psycopg import sql

from kinbox.core.errors import ConfigurationError
from kinbox.store.migrations import Component, render


def _table(schema: sql.Identifier) -> list[sql.Composed | sql.SQL]:
    return [sql.SQL("CREATE TABLE IF NOT EXISTS {}.t (x int)").format(schema)]


def test_render_prints_every_step_and_records_versions_without_a_connection() -> None:
    script = render("my_schema", [Component("demo", [_table, _table])])
    assert 'CREATE SCHEMA IF NOT EXISTS "my_schema";' in script
    assert script.count('CREATE TABLE IF NOT EXISTS "my_schema".t') == 2
    assert "VALUES ('demo', 1)" in script and "VALUES ('demo', 2)" in script


def test_render_rejects_a_bad_schema_name() -> None:
    with pytest.raises(ConfigurationError, match="schema='bad name'"):
        render("bad name", [Component("demo", [_table])])
