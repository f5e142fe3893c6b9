"""How the fake store runs async handlers: each call to its end, on an event loop of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class AwaitsAlone:
    """How a fake transaction awaits an async handler's call, without a loop thread.

    Each call gets a fresh loop (``asyncio.run``) on the calling thread: the
    fake has no connection a loop must own.
    """

    def wait(self, awaitable: Awaitable[T]) -> T:
        """Run an async handler's call to its end."""
        return asyncio.run(_awaited(awaitable))


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
