"""The async side of the store seam, free of any driver: what async handlers need of a store.

An ``async def`` handler's kind (:mod:`kinbox.apply.kinds`) asks the worker's
store for the same inbox on an async connection (:class:`AsyncCapable`, once,
when the batch code is set up) and runs the handler's coroutine through the
transaction (:class:`Awaiting`). :class:`~kinbox.store.awaiting.MixedInboxStore`
is the real implementation, :class:`~kinbox.testing.FakeStore` a fake.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, TypeVar, runtime_checkable

from kinbox.core.errors import ConfigurationError
from kinbox.store.base import InboxStore, InboxTransaction

T = TypeVar("T")


@runtime_checkable
class AsyncCapable(Protocol):
    """A store that can also run async handlers' transactions."""

    def for_async(self) -> InboxStore:
        """The same inbox (same tables, same consumer), whose transactions are :class:`Awaiting`.

        Asked once per async route when the worker's batch code is set up;
        it does no I/O then. Closing this store closes that one too.
        """


class Awaiting(InboxTransaction, Protocol):
    """An inbox transaction whose connection is async: handlers' coroutines run on its loop."""

    def wait(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` where the connection lives; block until it is done.

        The calling (batch) thread waits meanwhile, so the connection has one
        user at a time; its context variables go with the call.
        """


def async_store(store: InboxStore) -> InboxStore:
    """``store``'s inbox for async handlers.

    Raises:
        ConfigurationError: ``store`` cannot run them (it has no ``for_async``).
    """
    if isinstance(store, AsyncCapable):
        return store.for_async()
    raise ConfigurationError(
        f"an async handler needs an inbox store that runs async handlers; {store!r} does not "
        "(it has no for_async())"
    )
