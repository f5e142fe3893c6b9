"""Versioned, idempotent schema migrations shared by the inbox and the outbox.

Each *component* (``inbox``, ``outbox``) owns an ordered list of steps; step
``n`` (1-based) brings the component to version ``n``. The versions reached are
recorded in ``<schema>.schema_version``. ``migrate`` runs under a transaction-
scoped advisory lock, so several workers starting at once apply each step
exactly once and the others wait, then find nothing to do.

This module knows no table of its own beyond ``schema_version``: the inbox's
steps live in :mod:`kinbox.store.schema`, the outbox's in
:mod:`producer_outbox.schema`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.errors import SchemaError
from kinbox.core.names import sql_identifier

Step = Callable[[sql.Identifier], Sequence[sql.Composed | sql.SQL]]
"""One migration step: given the schema identifier, the statements to run."""

# Arbitrary but fixed: every kinbox process that migrates takes this lock key,
# combined with the schema name so two schemas in one database do not wait on
# each other.
_LOCK_NAMESPACE = 0x6B696E62  # "kinb"


@dataclass(frozen=True)
class Component:
    """A named, ordered list of migration steps; its version is ``len(steps)``."""

    name: str
    steps: Sequence[Step]

    @property
    def version(self) -> int:
        """The version this code needs: the number of steps."""
        return len(self.steps)


def _preamble(schema: sql.Identifier) -> list[sql.Composed | sql.SQL]:
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_version ("
            " component text PRIMARY KEY,"
            " version integer NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(schema),
    ]


def render(schema_name: str, components: Sequence[Component]) -> str:
    """Return the whole DDL as one SQL script, without connecting (``migrate --sql``)."""
    schema = sql.Identifier(sql_identifier(schema_name, setting="schema"))
    statements = _preamble(schema)
    for component in components:
        for number, step in enumerate(component.steps, start=1):
            statements.extend(step(schema))
            statements.append(_record(schema, component.name, number))
    # as_string(None) renders identifiers without a connection (psycopg >= 3.2).
    return "\n".join(s.as_string(None) + ";" for s in statements) + "\n"


def _record(schema: sql.Identifier, name: str, number: int) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {}.schema_version (component, version) VALUES ({}, {}) "
        "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version, applied_at = now()"
    ).format(schema, sql.Literal(name), sql.Literal(number))


def migrate(
    conn: psycopg.Connection[Any], schema_name: str, components: Sequence[Component]
) -> dict[str, tuple[int, int]]:
    """Bring every component up to date in one transaction.

    Returns, per component, ``(version before, version after)``.
    """
    schema = sql.Identifier(sql_identifier(schema_name, setting="schema"))
    done: dict[str, tuple[int, int]] = {}
    with conn.transaction():
        # Serialises concurrent migrators; released at COMMIT/ROLLBACK.
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_NAMESPACE, schema_name)
        )
        for statement in _preamble(schema):
            conn.execute(statement)
        for component in components:
            before = _read_version(conn, schema, component.name)
            for number in range(before + 1, component.version + 1):
                for statement in component.steps[number - 1](schema):
                    conn.execute(statement)
                conn.execute(_record(schema, component.name, number))
            done[component.name] = (before, max(before, component.version))
    return done


def _read_version(conn: psycopg.Connection[Any], schema: sql.Identifier, name: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT version FROM {}.schema_version WHERE component = %s").format(schema),
        (name,),
    ).fetchone()
    return int(row[0]) if row else 0


def check(conn: psycopg.Connection[Any], schema_name: str, component: Component) -> None:
    """Raise :class:`SchemaError` saying what to run unless ``component`` is up to date."""
    schema = sql.Identifier(sql_identifier(schema_name, setting="schema"))
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{schema_name}.schema_version",)
    ).fetchone()
    found = _read_version(conn, schema, component.name) if exists and exists[0] else 0
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.autocommit:
        conn.rollback()
    if found < component.version:
        raise SchemaError(
            f"kinbox {component.name} tables in schema {schema_name!r} are at version {found}, "
            f"this kinbox needs {component.version}: run `kinbox migrate --schema {schema_name}`"
        )
