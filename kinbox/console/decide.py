"""The console's actions, each recorded in ``operator_decisions`` before and after it runs.

- **Replay** dead letters (a group's open ones, or one): the very code of
  ``kinbox dlq replay`` (:func:`kinbox.apply.deadletter.replay`) re-publishes
  each to its original topic with a ``kinbox.replay`` header, and waits for the
  broker's acknowledgement. Its group then applies the event once: a group
  that applied it already ignores it.
- **Discard** dead letters: nothing is sent and nothing deleted; the decision
  says they were given up, and the console no longer shows them open.
- **Requeue** or **discard** a parked outbox row
  (:func:`producer_outbox.parked.requeue` and :func:`~producer_outbox.parked.discard`).
- **Release** or **discard** a parked key (:mod:`kinbox.console.parked`).

Each action first writes a ``pending`` decision (with the dead letters it
covers), then acts, then marks it ``done`` or ``failed`` with what came of
it. If the decision cannot be written, nothing is done.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kinbox.apply import deadletter
from kinbox.console.letters import LetterView
from kinbox.console.parked import InboxParking, ParkedKeySource
from kinbox.core.config import Settings
from kinbox.core.errors import KinboxError
from kinbox.core.publisher import Publisher
from kinbox.ops import parked_keys
from kinbox.store.decisions import DecidedRecord, DecisionLog
from kinbox.store.inspect import InboxReader
from producer_outbox import parked

log = logging.getLogger(__name__)


def _behind(released: int) -> str:
    return f"; released {released} parked event(s) behind them" if released else ""


@dataclass(frozen=True)
class ActionResult:
    """What an action did: its decision's id, whether it went through, and a sentence."""

    decision: int
    ok: bool
    message: str


class Actions:
    """Carries out and records the operators' decisions.

    Args:
        settings: Kafka and PostgreSQL.
        log: where decisions are recorded.
        keys: the parked keys of the inbox.
        publisher: creates the producer a replay sends through.
        scrub: masks secrets in what is recorded (an error may quote one).
    """

    def __init__(
        self,
        settings: Settings,
        log: DecisionLog,
        keys: ParkedKeySource,
        publisher: Callable[[Settings], Publisher],
        scrub: Callable[[str], str],
    ) -> None:
        self._settings = settings
        self._log = log
        self._keys = keys
        self._publisher = publisher
        self._scrub = scrub

    def replay(
        self, operator: str, letters: Sequence[LetterView], target: str, subject: str
    ) -> ActionResult:
        """Re-publish ``letters`` to their original topics (``kinbox dlq replay``'s code)."""

        def act() -> tuple[int, str]:
            publisher = self._publisher(self._settings)
            try:
                report = deadletter.replay(
                    [x.record for x in letters], publisher, id_headers=self._settings.id_headers
                )
                released = self._release_behind(letters, publisher)
            finally:
                publisher.close()
            topics = ", ".join(sorted({x.cause.topic for x in letters}))
            detail = f"replayed {report.replayed} dead letter(s) to {topics}"
            return report.replayed, detail + _behind(released)

        records = [x.decided() for x in letters]
        return self._decide(operator, "replay", target, subject, records, act)

    def discard(
        self, operator: str, letters: Sequence[LetterView], target: str, subject: str
    ) -> ActionResult:
        """Give ``letters`` up: recorded, and no longer shown open; they stay in Kafka."""

        def act() -> tuple[int, str]:
            publisher = self._publisher(self._settings)
            try:
                released = self._release_behind(letters, publisher)
            finally:
                publisher.close()
            detail = f"discarded {len(letters)} dead letter(s); they stay in Kafka"
            return len(letters), detail + _behind(released)

        records = [x.decided() for x in letters]
        return self._decide(operator, "discard", target, subject, records, act)

    def _release_behind(self, letters: Sequence[LetterView], publisher: Publisher) -> int:
        """Release the keys parked behind ``letters`` (given up or replayed); events released."""
        if not isinstance(self._keys, InboxParking):
            return 0
        by_group: dict[str, list[str]] = {}
        for x in letters:
            if x.event_id is not None:
                by_group.setdefault(x.cause.group, []).append(x.event_id)
        return sum(
            parked_keys.release_blocked_by(self._settings, group, ids, publisher)
            for group, ids in by_group.items()
        )

    def requeue_row(self, operator: str, row_id: uuid.UUID) -> ActionResult:
        """Put a parked outbox row back to pending (``kinbox outbox requeue --id``)."""

        def act() -> tuple[int, str]:
            with InboxReader(self._settings.database_url, self._settings.schema) as reader:
                done = parked.requeue(reader.connection, self._settings.schema, row_id=row_id)
            if not done.rows:
                raise KinboxError(f"outbox row {row_id} is not parked (any more)")
            return len(done.rows), f"requeued; {done.held} row(s) of its key follow it out"

        return self._decide(operator, "requeue", "outbox row", str(row_id), [], act)

    def discard_row(self, operator: str, row_id: uuid.UUID) -> ActionResult:
        """Delete a parked outbox row: its event is given up, its key's later rows go on."""

        def act() -> tuple[int, str]:
            with InboxReader(self._settings.database_url, self._settings.schema) as reader:
                row = parked.discard(reader.connection, self._settings.schema, row_id)
            if row is None:
                raise KinboxError(f"outbox row {row_id} is not parked (any more)")
            return 1, f"deleted the parked row of topic {row.topic} (key {row.key!r})"

        return self._decide(operator, "discard", "outbox row", str(row_id), [], act)

    def release_key(self, operator: str, group: str, topic: str, key: str) -> ActionResult:
        """Let a parked key's events go on."""

        def act() -> tuple[int, str]:
            count = self._keys.release(group, topic, key)
            return count, f"released {count} parked event(s)"

        return self._decide(operator, "release", "parked key", f"{group} {topic} {key}", [], act)

    def discard_key(self, operator: str, group: str, topic: str, key: str) -> ActionResult:
        """Drop a parked key's events."""

        def act() -> tuple[int, str]:
            count = self._keys.discard(group, topic, key)
            return count, f"discarded {count} parked event(s)"

        return self._decide(operator, "discard", "parked key", f"{group} {topic} {key}", [], act)

    def _decide(
        self,
        operator: str,
        action: str,
        target: str,
        subject: str,
        records: list[DecidedRecord],
        act: Callable[[], tuple[int, str]],
    ) -> ActionResult:
        decision = self._log.begin(operator, action, target, subject, records)
        try:
            count, detail = act()
        except KinboxError as exc:
            message = self._scrub(f"{action} of {target} {subject} failed: {exc}")
            log.error("decision %d by %s: %s", decision, operator, message)
            self._log.finish(decision, "failed", message)
            return ActionResult(decision, False, message)
        message = self._scrub(detail)
        log.info("decision %d by %s: %s of %s %s: %s", decision, operator, action, target,
                 subject, message)  # fmt: skip
        self._log.finish(decision, "done", message, count)
        return ActionResult(decision, True, message)
