"""Middleware: layers that watch every partition batch, in the manner of dramatiq.

A :class:`Middleware` overrides the hooks it needs; each default does nothing.
Hooks run on the batch thread, for one partition batch at a time:

``before_batch``
    in registration order, before any database work. An exception here
    propagates: the batch is not applied, nothing is committed past it, and
    the worker stops, loudly — a broken layer must not let events through
    unobserved.
``after_dead_letter``
    in reverse order, once per dead letter whose transaction committed (a
    rolled-back one is never reported).
``after_batch``
    in reverse order, with the :class:`~kinbox.apply.batch.BatchResult`, whether
    the batch committed, stopped at a failure or did both.

A failing ``after_*`` hook is logged and never raised: the batch is already
committed (or rolled back) and its offsets must still move.

Register with ``App(middleware=[...])`` (which replaces the defaults) or
:meth:`kinbox.app.App.add_middleware` (which appends to them). The default is
:class:`kinbox.middleware.telemetry.Telemetry`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kinbox.apply.deadletter import Letter
    from kinbox.apply.outcome import BatchResult
    from kinbox.consume.envelope import Record

log = logging.getLogger(__name__)


class Middleware:
    """Base class of kinbox middleware: every hook is a no-op until overridden."""

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Called before a partition batch is applied.

        Args:
            topic: the batch's topic.
            partition: its partition.
            records: its records, consecutive and in offset order, exactly as
                consumed (duplicates and records without a valid id included).
        """

    def after_dead_letter(self, letter: Letter) -> None:
        """Called for a dead letter the broker acknowledged and the database recorded."""

    def after_batch(
        self, topic: str, partition: int, records: Sequence[Record], result: BatchResult
    ) -> None:
        """Called after a partition batch, with what happened to it.

        ``result.next_offset`` is ``None`` when no transaction committed;
        ``result.failure`` says where the partition stopped, if it did.
        """


class Chain:
    """Runs the hooks of several middleware in the documented order."""

    def __init__(self, middleware: Sequence[Middleware]) -> None:
        self._forward = tuple(middleware)
        self._backward = self._forward[::-1]

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Call every ``before_batch`` in order; an exception propagates."""
        for layer in self._forward:
            layer.before_batch(topic, partition, records)

    def after_dead_letter(self, letter: Letter) -> None:
        """Call every ``after_dead_letter`` in reverse order; log failures."""
        for layer in self._backward:
            try:
                layer.after_dead_letter(letter)
            except Exception:
                log.exception("middleware %r failed in after_dead_letter (ignored)", layer)

    def after_batch(
        self, topic: str, partition: int, records: Sequence[Record], result: BatchResult
    ) -> None:
        """Call every ``after_batch`` in reverse order; log failures."""
        for layer in self._backward:
            try:
                layer.after_batch(topic, partition, records, result)
            except Exception:
                log.exception("middleware %r failed in after_batch (ignored)", layer)
