"""A connection for the outbox's commands: the database reached, the outbox tables migrated."""

from __future__ import annotations

from typing import Any

import psycopg

from kinbox.core.errors import SchemaError
from kinbox.core.names import sql_identifier
from kinbox.store.errors import translate
from kinbox.store.migrations import check
from producer_outbox.schema import OUTBOX

Connection = psycopg.Connection[Any]
"""A psycopg connection, as the outbox's functions take it."""


def connect(database_url: str, schema: str) -> Connection:
    """An autocommit connection to ``database_url``, whose ``schema`` holds migrated outbox tables.

    Raises:
        ConfigurationError: ``schema`` is not a valid identifier.
        StoreError: PostgreSQL cannot be reached (with the driver's message).
        SchemaError: the outbox tables are missing or older than this version needs.
    """
    sql_identifier(schema, setting="schema")
    try:
        conn = psycopg.connect(database_url, autocommit=True)
    except psycopg.Error as exc:
        # Judged as the inbox judges a failed connect (kinbox.store.errors).
        raise translate(exc) from exc
    try:
        check(conn, schema, OUTBOX)
    except SchemaError:
        conn.close()
        raise
    return conn
