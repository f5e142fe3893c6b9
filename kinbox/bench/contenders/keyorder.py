"""kinbox in the slow-keys scenario: a handler waiting on the database, in partition or key order.

Each event's handler runs ``SELECT pg_sleep(…)`` and writes its effect row in
the inbox transaction, as a handler waiting on a slow query or a lock does.
Partition order is ``@app.handler(topic)``; key order is ``@app.handler(topic,
ordering="key", concurrency=N)``. Both run :func:`kinbox.ops.worker.run` with
kinbox's defaults, as ``kinbox worker`` does.
"""

from __future__ import annotations

import inspect
from typing import Any

from kinbox.app import App
from kinbox.bench import effects
from kinbox.bench.contenders.kinbox_runner import serve
from kinbox.bench.spec import ChildSpec
from kinbox.core.event import Event

WAIT = "SELECT pg_sleep(%s)"


def key_order_missing() -> str | None:
    """Why kinbox's key order cannot run here (this kinbox has none), or ``None``."""
    parameters = inspect.signature(App.handler).parameters
    if "ordering" in parameters and "concurrency" in parameters:
        return None
    return (
        "this kinbox's @app.handler takes no ordering='key' (key order), so the key-order "
        "contender was skipped"
    )


def app(spec: ChildSpec, *, key_order: bool) -> App:
    """An app whose handler waits ``spec.extra['sleep_s']`` seconds, then writes its effect."""
    application = App(group_id=spec.group, schema=spec.schema)
    insert = effects.insert_one(spec.schema, spec.table).as_bytes()
    sleep = float(spec.extra["sleep_s"])

    def handle(event: Event, tx: Any) -> None:
        body = event.json()
        tx.execute(WAIT, (sleep,))
        tx.execute(
            insert,
            (event.id, event.partition, event.offset, body["userId"], body["lessonId"],
             body["sentAt"]),
        )  # fmt: skip

    # Passed by name from a dict: a kinbox without key order is told so by
    # key_order_missing() before this runs, not by the type checker.
    order: dict[str, Any] = (
        {"ordering": "key", "concurrency": int(spec.extra["concurrency"])} if key_order else {}
    )
    application.handler(spec.topic, **order)(handle)
    return application


def run_partition(spec: ChildSpec) -> None:
    """``@app.handler(topic)``: one event after the other."""
    serve(app(spec, key_order=False), spec)


def run_key(spec: ChildSpec) -> None:
    """``@app.handler(topic, ordering="key", concurrency=N)``: N keys side by side."""
    serve(app(spec, key_order=True), spec)
