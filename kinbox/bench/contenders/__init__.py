"""The contenders: kinbox five ways, the article's design, FastStream + an inbox, hand-written.

The slow-keys scenario has three of its own: kinbox in partition order and in
key order, and Confluent's parallel-consumer (Java) in key order.

Every contender consumes the same events from the same topic and partitions
and writes one business row per event (:mod:`kinbox.bench.effects`) into the
same PostgreSQL; each runs in its own process (:mod:`kinbox.bench.child`).

A contender's *scale* is the share of a scenario's events it gets: the
article's design and FastStream are two orders of magnitude slower, and a
full-size run of theirs would take the whole time budget. They get the first
events of the very same workload (same ids, keys and duplicate pattern).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Contender:
    """One way of applying Kafka events to PostgreSQL."""

    name: str
    """Short name for options and JSON."""
    label: str
    """What the report calls it."""
    entry: str
    """``module:function`` that consumes until SIGTERM, given a :class:`ChildSpec`."""
    exactly_once: bool = True
    """``False``: checked as at-least-once; duplicates applied are reported."""
    scale: float = 1.0
    """Share of the scenario's events this contender gets."""
    commit_size: int = 500
    """At most how many events one database commit covers (a poll's worth for the batching
    contenders): spaces the redelivery kills so that all of them fall before the end."""
    needs: str | None = None
    """An optional package this contender imports (``kinbox[bench]`` brings it)."""
    app: str | None = None
    """``module:attr`` of the app for ``kinbox worker``, the outside scenarios' way to run it.

    ``None``: the outside scenarios run :attr:`entry` in a process of its own.
    """

    requires: str | None = None
    """``module:function`` saying why it cannot run here (a string), or that it can (``None``)."""

    def missing(self) -> str | None:
        """Why this contender cannot run here, or ``None`` when it can."""
        if self.needs is not None and importlib.util.find_spec(self.needs) is None:
            return f"needs {self.needs} (pip install 'kinbox[bench]')"
        if self.requires is not None:
            module, _, function = self.requires.partition(":")
            reason: str | None = getattr(importlib.import_module(module), function)()
            return reason
        return None

    def available(self) -> bool:
        """Whether it can run here (what it needs is installed)."""
        return self.missing() is None


_HERE = "kinbox.bench.contenders"

CONTENDERS: tuple[Contender, ...] = (
    Contender(
        "kinbox-each", "kinbox @handler (per event)", f"{_HERE}.kinbox_runner:run_each",
        app=f"{_HERE}.deployed:each",
    ),
    Contender(
        "kinbox-batch", "kinbox @handler(batch=True)", f"{_HERE}.kinbox_runner:run_batch",
        app=f"{_HERE}.deployed:batch",
    ),
    Contender(
        "kinbox-each-async", "kinbox async @handler (per event)",
        f"{_HERE}.kinbox_runner:run_each_async",
    ),
    Contender(
        "kinbox-batch-async", "kinbox async @handler(batch=True)",
        f"{_HERE}.kinbox_runner:run_batch_async",
    ),
    Contender(
        "inbox-off", "kinbox batch, inbox off (at-least-once)",
        f"{_HERE}.kinbox_runner:run_inbox_off", exactly_once=False,
    ),
    Contender(
        "article", "article's design (txn + offset commit per event)",
        f"{_HERE}.article:run", scale=0.025, commit_size=1,
    ),
    Contender(
        "faststream", "FastStream + hand-written inbox", f"{_HERE}.faststream_inbox:run",
        scale=0.03, commit_size=1, needs="faststream",
    ),
    Contender("ceiling", "hand-written set-based (ceiling)", f"{_HERE}.setbased:run"),
    Contender(
        "hand", "hand-written set-based, streaming (async offset commits)",
        f"{_HERE}.setbased:run_streaming",
    ),
    Contender(
        "hand-each", "hand-written streaming, one INSERT per event (pipelined)",
        f"{_HERE}.setbased:run_streaming_each",
    ),
    Contender(
        "kinbox-partition-order", "kinbox @handler, partition order (5 ms handler)",
        f"{_HERE}.keyorder:run_partition",
    ),
    Contender(
        "kinbox-key-order", "kinbox @handler(ordering='key'), key order (5 ms handler)",
        f"{_HERE}.keyorder:run_key", requires=f"{_HERE}.keyorder:key_order_missing",
    ),
    Contender(
        "parallel-consumer", "Confluent parallel-consumer 0.5.3.2, KEY order (at-least-once)",
        f"{_HERE}.parallel_consumer:run", exactly_once=False,
    ),
)  # fmt: skip
"""Every contender, in report order."""

BY_NAME = {c.name: c for c in CONTENDERS}
ARTICLE = "article"
"""The baseline of the ``xarticle`` column."""
CEILING = "ceiling"
"""The baseline of the ``xceiling`` column."""
HAND = "hand"
"""The outside scenarios' baseline: the hand-written inbox a team deploys for latency too."""
HAND_EACH = "hand-each"
"""The hand-written streaming inbox with a per-event effect: kinbox's per-event handler's like."""
SLOW = ("kinbox-partition-order", "kinbox-key-order", "parallel-consumer")
"""The slow-keys scenario's contenders (and no other scenario's)."""
