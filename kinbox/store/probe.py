"""Is the database reachable? One short connection, for the readiness endpoint.

A fresh connection each time, never one of the worker's pool: a probe must
not take a connection a batch is waiting for, and a pooled connection that
is fine says nothing about whether a new one could be made.
"""

from __future__ import annotations

import psycopg

from kinbox.core.config import redact_url
from kinbox.core.describe import describe


def ping(conninfo: str, timeout: float = 3.0) -> str | None:
    """``None`` if ``SELECT 1`` answers within ``timeout`` seconds, else why not (no secrets)."""
    try:
        with psycopg.connect(
            conninfo, connect_timeout=max(1, round(timeout)), autocommit=True
        ) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return redact_url(describe(exc, 300))
    return None
