"""The skim: known duplicates dropped before their transaction, a run of batches at a time.

When a partition's last batch was all duplicates — a group replaying its
history after an offset reset, a member catching up on what another member
applied before a rebalance — its next records are most likely duplicates as
well. The runner then hands the batch processor a *run* of up to
:data:`RUN_BATCHES` batches at once and asks it to skim: every id of the run
is looked up in ``processed_events`` in one read-only statement, outside any
transaction (:meth:`~kinbox.core.inbox.InboxStore.known`), with its payload's
digest. Events found there with the same digest are dropped before their
batch's transaction (a row with another digest means a reused id: that
event goes to the claim, which reports it). A batch left with nothing opens
no transaction at all. What is left is applied exactly as before: each batch
of the run in its own transaction, its claim deciding what is fresh.

Why this keeps every event's effect exactly once: an id the look-up finds is
in a committed row, and a committed row only ever goes by retention (whose
window must outlast redelivery anyway), so the claim would have dropped the
event too — the skim only drops it sooner. An id it does not find is left to
the claim, which waits for a transaction still holding it and decides; the
look-up itself never waits for anything. A record re-published by ``kinbox
dlq replay`` is never skimmed: its claim may take over a dead-lettered row.
A look-up that fails skims nothing: the batches then claim every event, as
always, and meet the outage (or the refused id) there.

Why only after a whole batch of duplicates (:func:`worth_skimming`): a look-up
that finds nothing costs a round trip and an index probe per id, and a clean
stream never pays it. In a replay it spares each batch its transaction
(BEGIN, claim, COMMIT: three round trips, each a wait for the GIL on the way
back) and lets one statement cover four batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kinbox.core.errors import StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore, first_occurrences
from kinbox.core.letter import is_replay
from kinbox.core.outcome import BatchResult
from kinbox.core.reuse import payload_digests

log = logging.getLogger(__name__)

RUN_BATCHES = 4
"""Batches a run of a skimming partition holds at most (each still its own transaction).

A replay's cost per batch is mostly fixed — handing the batch to a thread,
a round trip, the GIL taken back after it — so a look-up over more records
spreads it thinner; four batches' ids (2,000 by default) take one statement
of a few milliseconds.
"""


@dataclass(frozen=True)
class Skim:
    """What one look-up found: the ids known already, and when it ran (``time.time_ns``)."""

    known: frozenset[str] = frozenset()
    started: int = 0
    ended: int = 0


NOTHING = Skim()
"""No look-up: every event goes to its claim."""


def worth_skimming(result: BatchResult, batch_size: int) -> bool:
    """Whether a partition's next records should be skimmed, given its last ``result``.

    When the result is a whole batch of duplicates and nothing else. A
    batch of a few duplicates at low load says little of what comes next,
    and a look-up there would only add a round trip to a fresh batch.
    """
    return (
        result.failure is None
        and not result.applied
        and not result.dead_lettered
        and result.duplicates >= batch_size
    )


def look_up(store: InboxStore, events: Sequence[Event]) -> Skim:
    """Look up the ids of one partition's ``events`` that may be skimmed.

    Never raises for a failed look-up.
    """
    asked = first_occurrences(events)
    # A replayed record, and an id that comes with two payloads in the run,
    # go to the claim, which takes over a dead letter or reports the reuse.
    left_out = {e.id for e in events if is_replay(e.headers)}
    if len(asked) < len(events):
        first: dict[str, int] = {}
        for event, digest in zip(events, payload_digests([e.value for e in events]), strict=True):
            if first.setdefault(event.id, digest) != digest:
                left_out.add(event.id)
    if left_out:
        asked = [e for e in asked if e.id not in left_out]
    started = time.time_ns()
    try:
        known = store.known(asked)
    except StoreError as exc:
        log.debug("skim of %d ids failed, claiming every event instead: %s", len(asked), exc)
        return NOTHING
    return Skim(frozenset(known), started, time.time_ns())
