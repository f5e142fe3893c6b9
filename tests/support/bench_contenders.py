"""Deliberately wrong contenders for the benchmark's own tests: the check must catch them.

Run by ``python -m kinbox.bench.child`` (the repository root is the working
directory, so ``tests`` imports).
"""

from __future__ import annotations

from typing import Any

from kinbox import App, Event
from kinbox.bench import effects
from kinbox.bench.contenders.kinbox_runner import settings
from kinbox.bench.spec import ChildSpec


def run_dropping(spec: ChildSpec) -> None:
    """kinbox's batch handler that silently skips every event at an offset divisible by 7."""
    from kinbox.ops.worker import run

    app = App(group_id=spec.group, schema=spec.schema)
    insert = effects.insert_many(spec.schema, spec.table)

    @app.handler(spec.topic, batch=True)
    def handle(events: list[Event], tx: Any) -> None:
        rows = [
            (e.id, e.partition, e.offset, "u", "l", e.json()["sentAt"])
            for e in events
            if e.offset % 7
        ]
        if rows:
            tx.execute(insert, [list(c) for c in zip(*rows, strict=True)])

    run(app, settings(app, spec))
