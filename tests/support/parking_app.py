"""The app of the parked-keys tests: a handler that parks keys, run by ``kinbox worker``.

``FAULT_TOPIC`` is its topic; ``PARK_ORDERING`` ``key`` registers it in key
order. An event whose payload says ``"hold": true`` is dead-lettered while
the file ``PARK_HOLD`` exists (the bug), and applied once it is gone (the
fix). Every applied event adds ``(event_id, key)`` to
``<KINBOX_SCHEMA>.park_effects``, whose ``seq`` is the order of application.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from psycopg import sql

from kinbox import App, DeadLetter, Event

TOPIC = os.environ.get("FAULT_TOPIC", "park-test")
SCHEMA = os.environ.get("KINBOX_SCHEMA", "kinbox")
HOLD = os.environ.get("PARK_HOLD", "")
ORDERING = os.environ.get("PARK_ORDERING", "partition")

EFFECTS_DDL = "CREATE TABLE {}.park_effects (seq bigserial PRIMARY KEY, event_id text, key text)"
"""The effects table, formatted with the schema identifier."""

app = App(group_id=os.environ.get("KINBOX_GROUP_ID", "park-test"))
_insert = sql.SQL("INSERT INTO {}.park_effects (event_id, key) VALUES (%s, %s)").format(
    sql.Identifier(SCHEMA)
)


def apply(event: Event, tx: Any) -> None:
    """Dead-letter a held event while the bug is there; record the others' effect."""
    if event.json().get("hold") and HOLD and Path(HOLD).exists():
        raise DeadLetter("held until the fix")
    tx.execute(_insert, (event.id, event.key.decode() if event.key else None))


if ORDERING == "key":
    app.handler(TOPIC, park_keys=True, ordering="key", concurrency=4)(apply)
else:
    app.handler(TOPIC, park_keys=True)(apply)
