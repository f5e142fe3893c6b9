"""Middleware: layers around the worker, every partition batch and every handler call.

A :class:`Middleware` overrides the hooks it needs; each default does nothing
(or, for the ``around_*`` wrappers, just calls through). Hooks that open
something have a matching hook that runs on every path, errors included, so a
span or a context opened in one is always closed in the other.

``before_worker_start`` / ``after_worker_stop``
    once per worker, on its consume loop's thread, before it joins the group
    and after it has left. An exception in ``before_worker_start`` stops the
    worker from starting; the layers already started get ``after_worker_stop``.
``before_batch``
    in registration order, on a batch thread, before any database work
    (batches of different partitions run on different threads at the same
    time, so a layer that keeps state shares it between them; two batches
    of one partition never overlap, and a batch's hooks all run on its
    thread). An exception here propagates: the batch is not applied, nothing
    is committed past it, and the worker stops, loudly — a broken layer must
    not let events through unobserved (``kinbox worker`` exits with status
    10; 9 for ``SystemExit``). The layers whose ``before_batch`` ran still get their
    ``after_batch``, with the error.
``around_event`` / ``around_events``
    around each call of a per-event handler (one event) or a batch handler
    (the batch's fresh events), inside the inbox transaction; the first
    registered is the outermost. A wrapper calls ``call_next`` once and
    returns what it returned; the handler's exception must pass through
    unchanged (re-raise it), because the failure policy judges exactly what
    the handler raised. A handler may be called again for the same event
    when its batch is redone (see :mod:`kinbox.apply.dispatch`).
``around_event_async`` / ``around_events_async``
    the same, around an ``async def`` handler's call, on the event loop of
    the async handlers: ``return await call_next(event)``. By default a
    layer's sync ``around_event`` / ``around_events`` wraps the call from a
    thread of its own, so a layer written for sync handlers still sees
    every call; overriding these keeps the call on the loop.
``after_step``
    in reverse order, on the batch thread, after each claim of the batch's
    event ids and each COMMIT (a batch redone or narrowed down has several
    of each), with when it ran and what it found: a report, nothing to close.
``after_dead_letter``
    in reverse order, once per dead letter whose transaction committed (a
    rolled-back one is never reported).
``after_batch``
    in reverse order, with the :class:`~kinbox.core.outcome.BatchResult`,
    whether the batch committed, stopped at a failure or did both, and with
    ``error`` set when something raised instead (the result then says nothing
    was committed).

A failing ``after_*`` hook is logged and never raised: the batch is already
committed (or rolled back) and its offsets must still move.

Register with ``App(middleware=[...])`` (which replaces the defaults) or
:meth:`kinbox.app.App.add_middleware` (which appends to them). The default is
:class:`kinbox.middleware.telemetry.Telemetry`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from kinbox.core.outcome import BatchResult, Step

if TYPE_CHECKING:
    from kinbox.core.config import Settings
    from kinbox.core.event import Event
    from kinbox.core.lag import LagBoard
    from kinbox.core.letter import Letter
    from kinbox.core.record import Record

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerInfo:
    """Who is starting or stopping: what ``before_worker_start`` and ``after_worker_stop`` get.

    Attributes:
        group_id: the consumer group (also the inbox's dedup scope).
        topics: the topics the worker consumes, sorted.
        settings: the worker's validated settings, when it has them.
        lag: the consumer's lag per assigned partition, when the Kafka
            client reports it (:mod:`kinbox.core.lag`).
    """

    group_id: str
    topics: tuple[str, ...]
    settings: Settings | None = None
    lag: LagBoard | None = None


class Middleware:
    """Base class of kinbox middleware: every hook is a no-op until overridden."""

    def before_worker_start(self, worker: WorkerInfo) -> None:
        """Called once, before the worker joins its group."""

    def after_worker_stop(self, worker: WorkerInfo, error: BaseException | None) -> None:
        """Called once, after the worker left its group; ``error`` if it stopped on one."""

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Called before a partition batch is applied.

        Args:
            topic: the batch's topic.
            partition: its partition.
            records: its records, consecutive and in offset order, exactly as
                consumed (duplicates and records without a valid id included).
        """

    def around_event(self, event: Event, call_next: Callable[[Event], object]) -> object:
        """Wrap one call of a per-event handler; return ``call_next(event)``."""
        return call_next(event)

    def around_events(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], object]
    ) -> object:
        """Wrap one call of a batch handler; return ``call_next(events)``."""
        return call_next(events)

    async def around_event_async(
        self, event: Event, call_next: Callable[[Event], Awaitable[object]]
    ) -> object:
        """Wrap one call of an ``async def`` per-event handler; return ``await call_next(event)``.

        Runs on the event loop of the async handlers. By default, a layer's
        own :meth:`around_event` wraps the call on a thread of its own (its
        ``call_next`` waits there while the handler runs on the loop): a
        layer that wraps async handlers often overrides this too, so the
        call stays on the loop.
        """
        if not _overrides(self, "around_event"):
            return await call_next(event)
        return await _on_a_thread(self.around_event, event, call_next)

    async def around_events_async(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], Awaitable[object]]
    ) -> object:
        """Wrap one call of an ``async def`` batch handler (see :meth:`around_event_async`)."""
        if not _overrides(self, "around_events"):
            return await call_next(events)
        return await _on_a_thread(self.around_events, events, call_next)

    def after_step(self, step: Step) -> None:
        """Called after each claim and each COMMIT of a batch's transaction (see :class:`Step`)."""

    def after_dead_letter(self, letter: Letter) -> None:
        """Called for a dead letter the broker acknowledged and the database recorded."""

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None,
    ) -> None:
        """Called after a partition batch, with what happened to it.

        ``result.next_offset`` is ``None`` when no transaction committed;
        ``result.failure`` says where the partition stopped, if it did;
        ``error`` is what raised out of the batch (a ``before_batch`` hook,
        say), in which case nothing was committed and the worker stops.
        """


class Chain:
    """Runs the hooks of several middleware in the documented order."""

    def __init__(self, middleware: Sequence[Middleware]) -> None:
        self._forward = tuple(middleware)
        self._backward = self._forward[::-1]
        # Bound once: the around-wrappers are on the hot path, one per call.
        self._event_layers = [
            m.around_event for m in self._forward if _overrides(m, "around_event")
        ]
        self._batch_layers = [
            m.around_events for m in self._forward if _overrides(m, "around_events")
        ]
        self._event_layers_async = [
            m.around_event_async for m in self._forward if _wraps_async(m, "around_event")
        ]
        self._batch_layers_async = [
            m.around_events_async for m in self._forward if _wraps_async(m, "around_events")
        ]
        self._step_layers = [m for m in self._backward if _overrides(m, "after_step")]

    def before_worker_start(self, worker: WorkerInfo) -> list[Middleware]:
        """Call every ``before_worker_start`` in order; return the layers that started.

        Raises:
            Exception: what a hook raised, after ``after_worker_stop`` ran for
                the layers that had started.
        """
        started: list[Middleware] = []
        for layer in self._forward:
            try:
                layer.before_worker_start(worker)
            except BaseException as exc:
                _stop(started, worker, exc)
                raise
            started.append(layer)
        return started

    def after_worker_stop(self, worker: WorkerInfo, error: BaseException | None) -> None:
        """Call every ``after_worker_stop`` in reverse order; log failures."""
        _stop(list(self._forward), worker, error)

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Call every ``before_batch`` in order.

        Raises:
            Exception: what a hook raised; ``after_batch`` then runs, with the
                error, for the layers before it (see :meth:`after_batch`).
        """
        for done, layer in enumerate(self._forward):
            try:
                layer.before_batch(topic, partition, records)
            except BaseException as exc:
                self.after_batch(topic, partition, records, BatchResult(None), exc, started=done)
                raise

    def around_event(self, event: Event, call: Callable[[Event], object]) -> object:
        """``call(event)`` inside every ``around_event``, the first registered outermost."""
        layers = self._event_layers
        if len(layers) == 1:  # the usual chain (telemetry alone): no wrapper per call
            return layers[0](event, call)
        for layer in reversed(layers):
            call = _wrap(layer, call)
        return call(event)

    def around_events(
        self, events: Sequence[Event], call: Callable[[Sequence[Event]], object]
    ) -> object:
        """``call(events)`` inside every ``around_events``, the first registered outermost."""
        for layer in reversed(self._batch_layers):
            call = _wrap(layer, call)
        return call(events)

    async def around_event_async(
        self, event: Event, call: Callable[[Event], Awaitable[object]]
    ) -> object:
        """``await call(event)`` inside every ``around_event_async``, the first outermost."""
        for layer in reversed(self._event_layers_async):
            call = _wrap_async(layer, call)
        return await call(event)

    async def around_events_async(
        self, events: Sequence[Event], call: Callable[[Sequence[Event]], Awaitable[object]]
    ) -> object:
        """``await call(events)`` inside every ``around_events_async``, the first outermost."""
        for layer in reversed(self._batch_layers_async):
            call = _wrap_async(layer, call)
        return await call(events)

    @property
    def observes_steps(self) -> bool:
        """Whether a layer wants :meth:`after_step` (the batch then times its steps)."""
        return bool(self._step_layers)

    def after_step(self, step: Step) -> None:
        """Call every ``after_step`` in reverse order; log failures."""
        for layer in self._step_layers:
            try:
                layer.after_step(step)
            except Exception:
                log.exception("middleware %r failed in after_step (ignored)", layer)

    def after_dead_letter(self, letter: Letter) -> None:
        """Call every ``after_dead_letter`` in reverse order; log failures."""
        for layer in self._backward:
            try:
                layer.after_dead_letter(letter)
            except Exception:
                log.exception("middleware %r failed in after_dead_letter (ignored)", layer)

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None = None,
        *,
        started: int | None = None,
    ) -> None:
        """Call ``after_batch`` in reverse order (of the first ``started`` layers); log failures."""
        layers = self._forward if started is None else self._forward[:started]
        for layer in reversed(layers):
            try:
                layer.after_batch(topic, partition, records, result, error)
            except Exception:
                log.exception("middleware %r failed in after_batch (ignored)", layer)


def _overrides(layer: Middleware, hook: str) -> bool:
    """Whether ``layer`` has its own ``hook``: the default only calls through."""
    return getattr(type(layer), hook) is not getattr(Middleware, hook)


def _wraps_async(layer: Middleware, hook: str) -> bool:
    """Whether ``layer`` wraps async handlers' calls: its own ``hook``, sync or async."""
    return _overrides(layer, hook) or _overrides(layer, hook + "_async")


def _wrap_async(
    layer: Callable[[T, Callable[[T], Awaitable[object]]], Awaitable[object]],
    inner: Callable[[T], Awaitable[object]],
) -> Callable[[T], Awaitable[object]]:
    return lambda value: layer(value, inner)


async def _on_a_thread(
    hook: Callable[[T, Callable[[T], object]], object],
    subject: T,
    call_next: Callable[[T], Awaitable[object]],
) -> object:
    """A sync ``around_*`` hook around an async call: the hook on a thread, the call on the loop.

    The loop is free while the hook runs, and the hook's thread waits while
    the call runs, so the connection still has one user at a time; context
    variables go with each (``to_thread`` and ``run_coroutine_threadsafe`` copy them).
    """
    loop = asyncio.get_running_loop()

    async def awaited(value: T) -> object:
        return await call_next(value)

    def blocking(value: T) -> object:
        return asyncio.run_coroutine_threadsafe(awaited(value), loop).result()

    return await asyncio.to_thread(hook, subject, blocking)


def _wrap(
    layer: Callable[[T, Callable[[T], object]], object], inner: Callable[[T], object]
) -> Callable[[T], object]:
    return lambda value: layer(value, inner)


def _stop(layers: list[Middleware], worker: WorkerInfo, error: BaseException | None) -> None:
    for layer in reversed(layers):
        try:
            layer.after_worker_stop(worker, error)
        except Exception:
            log.exception("middleware %r failed in after_worker_stop (ignored)", layer)
