"""The worker's metrics: kinbox's instruments on one meter, and what each records.

The instruments and their units and descriptions are :mod:`kinbox.core.otel.semconv`'s;
the telemetry middleware (:mod:`.telemetry`) calls these at its hooks. The
attributes of the conventions' instruments are made once per topic, so a
handler call builds no dict for them. ``messaging.process.duration`` is
recorded without the partition: it would multiply the histogram's series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import Observation

from kinbox.core.otel import semconv as sc
from kinbox.core.otel.instruments import counter, histogram, shared_gauge
from kinbox.core.otel.semconv import error_type
from kinbox.middleware.spans import Attributes

if TYPE_CHECKING:
    from kinbox.core.lag import LagBoard
    from kinbox.core.outcome import BatchResult, Step


class Meters:
    """kinbox's instruments on ``meter``; :meth:`start` names the worker's group."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._received = counter(meter, sc.RECEIVED)
        self._consumed = counter(meter, sc.CONSUMED_MESSAGES)
        self._applied = counter(meter, sc.APPLIED_EVENTS)
        self._duplicates = counter(meter, sc.DUPLICATE_EVENTS)
        self._reused = counter(meter, sc.REUSED_IDS)
        self._dead_lettered = counter(meter, sc.DEAD_LETTERED_EVENTS)
        self._failures = counter(meter, sc.BATCHES_FAILED)
        self._undeliverable = counter(meter, sc.UNDELIVERABLE)
        self._process = histogram(meter, sc.PROCESS_DURATION, sc.DURATION_BUCKETS)
        self._size = histogram(meter, sc.BATCH_SIZE, sc.SIZE_BUCKETS)
        self._steps = {
            "claim": histogram(meter, sc.CLAIM_DURATION, sc.DURATION_BUCKETS),
            "commit": histogram(meter, sc.COMMIT_DURATION, sc.DURATION_BUCKETS),
        }
        self._lag = shared_gauge(meter, sc.CONSUMER_LAG)
        self._group: str | None = None
        self._labels: dict[tuple[str, str], Attributes] = {}

    def start(self, owner: object, group: str | None, board: LagBoard | None) -> None:
        """A worker of ``group`` starts: its lag (``board``) is reported until :meth:`stop`."""
        self._group = group
        self._labels.clear()
        if board is not None and group is not None:
            self._lag.watch(owner, lambda _owner: _lags(group, board))

    def stop(self, owner: object) -> None:
        """Stop reporting ``owner``'s lag."""
        self._lag.forget(owner)

    def received(self, topic: str, records: int, *, all_of_them: bool) -> None:
        """A partition batch of ``records`` arrived; ``all_of_them``: the SDK's instruments too."""
        self._received.add(records, {sc.TOPIC: topic})
        if all_of_them:
            self._consumed.add(records, self._conventional("consume", topic))
            self._size.record(records, {sc.TOPIC: topic})

    def step(self, step: Step) -> None:
        """A claim or COMMIT took ``step.ended - step.started``."""
        seconds = max(0, step.ended - step.started) / 1e9
        self._steps[step.name].record(seconds, {sc.TOPIC: step.topic})

    def processed(self, topic: str, seconds: float, error: BaseException | None) -> None:
        """One handler call took ``seconds`` and raised ``error`` (or nothing)."""
        labels = self._conventional(sc.PROCESS, topic)
        if error is not None:
            labels = {**labels, sc.ERROR_TYPE: error_type(error)}
        self._process.record(seconds, labels)

    def settled(self, topic: str, result: BatchResult, error: BaseException | None) -> None:
        """What became of a partition batch: applied, duplicates, reused ids, dead letters."""
        labels = {sc.TOPIC: topic}
        self._applied.add(result.applied, labels)
        self._duplicates.add(result.duplicates, labels)
        self._reused.add(result.reused, labels)
        self._dead_lettered.add(result.dead_lettered, labels)
        failure = result.failure
        if failure is not None:
            self._failures.add(1, {**labels, sc.KIND: failure.kind})
            if failure.dead_letter_topic is not None:
                self._undeliverable.add(
                    1, {sc.TOPIC: failure.dead_letter_topic, sc.SOURCE_TOPIC: topic}
                )
        elif error is not None:
            self._failures.add(1, {**labels, sc.KIND: "error"})

    def _conventional(self, operation: str, topic: str) -> Attributes:
        """The conventions' attributes of a measurement of ``operation`` on ``topic``."""
        found = self._labels.get((operation, topic))
        if found is None:
            found = {sc.MESSAGING_SYSTEM: sc.KAFKA, sc.OPERATION_NAME: operation}
            found[sc.DESTINATION] = topic
            if self._group is not None:
                found[sc.CONSUMER_GROUP] = self._group
            self._labels[(operation, topic)] = found
        return found


def _lags(group: str, board: LagBoard) -> list[Observation]:
    """``kinbox.consumer.lag`` of one worker: a point per assigned partition."""
    return [
        Observation(lag, {sc.GROUP: group, sc.TOPIC: topic, sc.PARTITION_LABEL: str(partition)})
        for (topic, partition), lag in sorted(board.read().items())
    ]
