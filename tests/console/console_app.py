"""The app whose worker makes the console tests' dead letters, configured by env.

``CONSOLE_TEST_TOPIC``: the topic. ``CONSOLE_TEST_BROKEN``: a file; while it
exists, ``{"kind": "poison"}`` fails (``ValueError``: the handler's bug),
and once it is removed (the fix deployed) the event applies. Other kinds
always fail: ``refuse`` asks for a dead letter naming its customer,
``hostile`` asks for one whose reason holds HTML and script, ``leak``
raises an error quoting the database URL, password and all; ``hold`` asks
for one while ``<CONSOLE_TEST_BROKEN>.hold`` exists. The handler parks keys:
a dead letter holds its key's later events back. Every applied event adds
a row to ``<schema>.console_effects``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from psycopg import sql

from kinbox import App, DeadLetter, Event

TOPIC = os.environ.get("CONSOLE_TEST_TOPIC", "console-test")
BROKEN = os.environ.get("CONSOLE_TEST_BROKEN", "")
SCHEMA = os.environ.get("KINBOX_SCHEMA", "kinbox")
HOLD = f"{BROKEN}.hold"
HOSTILE_REASON = "<b>bold</b><script>window.__pwned = 'reason'</script>"

app = App(group_id=os.environ.get("KINBOX_GROUP_ID", "console-test"))


@app.handler(TOPIC, park_keys=True)
def handle(event: Event, tx: Any) -> None:
    payload = event.json()
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if kind == "poison" and BROKEN and Path(BROKEN).exists():
        raise ValueError(f"cannot parse amount {payload.get('amount')!r}")
    if kind == "refuse":
        raise DeadLetter(f"customer {payload['customer']} unknown")
    if kind == "hostile":
        raise DeadLetter(HOSTILE_REASON)
    if kind == "hold" and Path(HOLD).exists():
        raise DeadLetter("held until the fix")
    if kind == "leak":
        raise RuntimeError(f"cannot reach {os.environ['KINBOX_DATABASE_URL']}")
    tx.execute(
        sql.SQL("INSERT INTO {}.console_effects (event_id) VALUES (%s)").format(
            sql.Identifier(SCHEMA)
        ),
        (event.id,),
    )
