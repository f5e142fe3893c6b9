"""Lanes: how several relays share the outbox without reordering a key.

Plain ``FOR UPDATE SKIP LOCKED`` across relays reorders a key: relay A locks
rows 1-2 of key k, relay B skips them and publishes row 3 first. So rows are
split into ``lanes`` by a hash of their partition key (see
:data:`producer_outbox.claim.LANE_EXPRESSION`); a relay publishes a lane only
while it holds that lane's session-level advisory lock, and publishes the lane
in ``(txid, seq)`` order (:mod:`producer_outbox.claim`). One key lives in one
lane, one lane has one publisher, so a key's rows go out in order whatever the
number of relays.

The locks are session-level, taken on the relay's *work* connection, the one
that runs the claims and the marks: they hold across those short
transactions, so between claiming a row and marking it the lane stays the
relay's (a claim locks no row: :mod:`producer_outbox.claim`). A relay gives a
lane up only when none of its rows is in flight (:meth:`LaneOwner.balance`).
If the work connection dies, the locks go with it while rows may still be on
their way to Kafka; another relay may then take the lane and publish those
rows again: a duplicate, never a loss nor a break of the key's order (each
publisher sends a key's rows in order, from the first one not marked sent),
and the first relay never marks a failure of a row it claimed on the dead
connection (:mod:`producer_outbox.flight`).

Every relay also holds a shared advisory lock on ``(relays key, lanes)``. It
counts the live relays (for an even split: each takes at most
``ceil(lanes / relays)`` and releases any extra lane between batches) and
catches a relay started with a different ``--lanes``, which would map one key
to two lanes.

A relay splits its share among its *lane groups* (:mod:`.group`), each with its
own connection: group ``g`` of ``G`` takes its part of the share
(:func:`group_target`) and locks its lanes on its own connection, so each lane
still has one connection that holds its lock and runs its batches. Only group
0 registers the relay, so the count is of relays, not of connections.
"""

from __future__ import annotations

import logging
import math
import random
import zlib
from collections.abc import Collection
from typing import Any

import psycopg

from kinbox.core.errors import ConfigurationError

log = logging.getLogger(__name__)

_CONNECTION_DB = "(SELECT oid FROM pg_database WHERE datname = current_database())"


def _key(text: str) -> int:
    """Return a stable signed 32-bit advisory-lock key for ``text``."""
    value = zlib.crc32(text.encode())
    return value - (1 << 32) if value >= 1 << 31 else value


def lane_key(schema: str) -> int:
    """The first half of the advisory lock key of ``schema``'s lanes (the lane is the second)."""
    return _key(f"kinbox.outbox.lane:{schema}")


def group_target(share: int, group: int, groups: int) -> int:
    """Lanes group ``group`` of ``groups`` takes of a relay's ``share``: an even split."""
    return share // groups + (1 if group < share % groups else 0)


class LaneOwner:
    """Acquires, balances and releases a relay's lanes on one connection.

    Args:
        conn: the connection that holds the lane locks and runs their batches.
        schema: the outbox's schema.
        lanes: every relay's lane count.
        group: which of the relay's ``groups`` lane groups this is; group 0
            registers the relay (:meth:`register`).
    """

    def __init__(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        schema: str,
        lanes: int,
        *,
        group: int = 0,
        groups: int = 1,
    ):
        self._conn = conn
        self.lanes = lanes
        self.group, self.groups = group, groups
        self._lane_key = lane_key(schema)
        self._relays_key = _key(f"kinbox.outbox.relays:{schema}")
        self.owned: set[int] = set()

    def register(self) -> None:
        """Announce this relay; refuse to run beside relays with another lane count.

        Raises:
            ConfigurationError: another relay of this schema uses a different ``lanes``.
        """
        self._conn.execute("SELECT pg_advisory_lock_shared(%s, %s)", (self._relays_key, self.lanes))
        row = self._conn.execute(
            "SELECT array_agg(DISTINCT objid::bigint) FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted AND objsubid = 2"
            f" AND database = {_CONNECTION_DB}"
            " AND classid = (%s::bigint & 4294967295)::oid AND objid <> %s::oid",
            (self._relays_key, self.lanes),
        ).fetchone()
        others = row[0] if row else None
        if others:
            self._conn.execute(
                "SELECT pg_advisory_unlock_shared(%s, %s)", (self._relays_key, self.lanes)
            )
            raise ConfigurationError(
                f"lanes={self.lanes} is not allowed: relays of this schema already run "
                f"with lanes={sorted(others)}; every relay of a schema needs the same value"
            )

    def relays(self) -> int:
        """How many relays of this schema are registered (at least this one)."""
        row = self._conn.execute(
            "SELECT count(*) FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted AND objsubid = 2"
            f" AND database = {_CONNECTION_DB}"
            " AND classid = (%s::bigint & 4294967295)::oid AND objid = %s::oid",
            (self._relays_key, self.lanes),
        ).fetchone()
        return max(1, int(row[0])) if row else 1

    def balance(self, busy: Collection[int] = ()) -> set[int]:
        """Release lanes above this relay's fair share, then try to take free ones.

        A lane of ``busy`` (rows of it are in flight) is never released: an
        extra lane goes once its rows are settled, at a later call. Returns the
        lanes owned now.
        """
        share = math.ceil(self.lanes / self.relays())
        target = group_target(share, self.group, self.groups)
        spare = sorted(self.owned - set(busy), reverse=True)
        while len(self.owned) > target and spare:
            self._unlock(spare.pop(0))
        if len(self.owned) < target:
            # Start at a random lane so relays starting together spread out.
            start = random.randrange(self.lanes)
            for offset in range(self.lanes):
                lane = (start + offset) % self.lanes
                if len(self.owned) >= target:
                    break
                if lane not in self.owned and self._try_lock(lane):
                    self.owned.add(lane)
        return set(self.owned)

    def release_all(self) -> None:
        """Give every lane back (graceful shutdown)."""
        for lane in list(self.owned):
            self._unlock(lane)

    def _try_lock(self, lane: int) -> bool:
        row = self._conn.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (self._lane_key, lane)
        ).fetchone()
        return bool(row and row[0])

    def _unlock(self, lane: int) -> None:
        self._conn.execute("SELECT pg_advisory_unlock(%s, %s)", (self._lane_key, lane))
        self.owned.discard(lane)
