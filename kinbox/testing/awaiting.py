"""How the fake store runs async handlers: each call to its end, on an event loop of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from kinbox.store.loop import awaited

T = TypeVar("T")


class AwaitsAlone:
    """A fake transaction's :meth:`~kinbox.core.inbox.Awaiting.wait`, without a loop thread.

    Each call gets a fresh loop (``asyncio.run``) on the calling thread: the
    fake has no connection a loop must own.
    """

    def wait(self, awaitable: Awaitable[T]) -> T:
        """Run an async handler's call to its end."""
        return asyncio.run(awaited(awaitable))
