"""A one-file service: a bare @handler on the default app (`kinbox worker tests.unit.bare_app`)."""

from __future__ import annotations

from typing import Any

from kinbox import Event, handler


@handler("bare-topic")
def handle(event: Event, tx: Any) -> None:
    tx.execute("SELECT 1")
