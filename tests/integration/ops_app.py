"""A kinbox app for the operations tests: a handler that can be held, and enqueues its effect.

Configured by env so a ``kinbox worker`` subprocess can run it:
``OPS_TEST_TOPIC``; ``OPS_TEST_HOLD``, a file: while it exists, the handler
blocks (after writing ``<file>.started``); ``OPS_TEST_ENQUEUE``, a topic the
handler enqueues one outbox row to per event (in its inbox transaction);
an event whose payload says ``{"bad": true}`` is dead-lettered.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kinbox import App, DeadLetter, Event
from producer_outbox import enqueue

TOPIC = os.environ.get("OPS_TEST_TOPIC", "ops-test")
HOLD = os.environ.get("OPS_TEST_HOLD", "")
ENQUEUE = os.environ.get("OPS_TEST_ENQUEUE", "")
SCHEMA = os.environ.get("KINBOX_SCHEMA", "kinbox")

app = App(group_id=os.environ.get("KINBOX_GROUP_ID", "ops-test"))


@app.handler(TOPIC)
def handle(event: Event, tx: Any) -> None:
    if HOLD and Path(HOLD).exists():
        Path(HOLD + ".started").touch()
        while Path(HOLD).exists():
            time.sleep(0.05)
    if event.value and event.json().get("bad"):
        raise DeadLetter("bad event")
    if ENQUEUE:
        enqueue(tx, ENQUEUE, {"for": event.id}, key=event.id, schema=SCHEMA)
