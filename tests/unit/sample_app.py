from __future__ import annotations

from typing import Any

from kinbox import App, Event

app = App(group_id="sample")


@app.handler("sample-topic")
def handle(event: Event, tx: Any) -> None:
    tx.execute("SELECT 1")
