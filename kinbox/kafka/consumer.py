"""The consuming side of the Kafka seam: :class:`Transport` and :class:`KafkaTransport`.

:class:`Transport` is what the runner depends on (a fake implements it in the
unit tests); :class:`KafkaTransport` is the real one, on a confluent-kafka
``Consumer``.

Offsets: ``enable.auto.commit=false`` and ``enable.auto.offset.store=false``.
kinbox commits only offsets whose events are committed in PostgreSQL —
asynchronously while it runs, synchronously on revoke and at shutdown;
nothing in librdkafka commits on its own (auto-commit would also commit on
revoke, including partitions whose batch was rolled back).

Isolation: ``read_committed``. A transactional producer's records reach the
handlers only once their transaction committed; aborted ones never do. The
consumer reads up to the partition's *last stable offset*: behind a
transaction still open it waits (polling, without error), and the offsets it
commits step over the transaction markers, which take an offset each but are
no record.

Prefetch: librdkafka fetches ahead into a local queue, by default up to
64 MiB (``queued.max.messages.kbytes``) and 100,000 records per partition
(``queued.min.messages``), with fetch responses of up to 50 MiB
(``fetch.max.bytes``). kinbox applies at most one batch per partition at a
time and keeps the next batches of each partition waiting in its lane
(:mod:`kinbox.consume.lanes`), so most of that queue would only be memory:
:data:`PREFETCH` sets smaller limits. ``-X`` overrides them.

Every call into the client runs under a :class:`~kinbox.kafka.watch.CallWatch`:
a synchronous commit can wait forever inside librdkafka, and then the worker
must say so, and end, rather than stall in silence.

Closing: the member leaves the group first (``unsubscribe()``, then polls
until its partitions are revoked, at most :data:`LEAVE_WAIT`), and only then
is the client closed. A revoke served inside ``Consumer.close()`` is a hazard:
after the callback the binding calls librdkafka's ``incremental_unassign``
(or ``assign``) holding the GIL, and while the consumer closes in the middle
of a rebalance librdkafka may never answer it
(https://github.com/confluentinc/librdkafka/issues/4884, /4527), which
freezes every thread of the process. Served inside a poll, the group thread
is still running and answers; ``close()`` then has nothing to revoke.
"""

from __future__ import annotations

import ctypes
import logging
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from kinbox.core import describe as text
from kinbox.core.config import Settings
from kinbox.core.errors import FatalTransportError, TransportError
from kinbox.core.event import Event
from kinbox.core.failpoints import failpoint
from kinbox.core.lag import LagBoard
from kinbox.core.record import Record
from kinbox.core.transport import Partition, RebalanceListener
from kinbox.kafka.errors import ClientLog, broken, create_client, describe, is_fatal, translate
from kinbox.kafka.stats import DEFAULT_INTERVAL_MS, on_stats
from kinbox.kafka.watch import CallWatch

log = logging.getLogger(__name__)

PREFETCH: dict[str, int] = {
    # The local queue of fetched records, all partitions together (KiB).
    "queued.max.messages.kbytes": 16384,
    # A full queue postpones a partition's next fetch this long (librdkafka's
    # default of 1 s would starve a consumer whose queue is small).
    "fetch.queue.backoff.ms": 20,
    # One fetch response, all partitions (bytes); the broker may exceed it
    # by one record batch, so a large record is still delivered.
    "fetch.max.bytes": 8 * 1024 * 1024,
    # How long the broker holds a fetch that has nothing to return: a
    # partition resumed meanwhile waits for it (librdkafka's default: 500).
    "fetch.wait.max.ms": 100,
    # One partition's share of a fetch (librdkafka's default: 1 MiB): the
    # queue interleaves partitions finely, so a partition held for a full
    # lane drops little of what was fetched for it.
    "max.partition.fetch.bytes": 256 * 1024,
}
"""kinbox's prefetch limits for the consumer (librdkafka's own defaults are larger)."""

LEAVE_WAIT = 10.0
"""Seconds :meth:`KafkaTransport.close` polls at most for the revoke of the member's partitions."""

_LEAVE_POLL = 0.1


def consumer_config(settings: Settings, lag: LagBoard | None = None) -> dict[str, Any]:
    """Return the librdkafka configuration for ``settings``; ``-X`` overrides win.

    With ``lag``, librdkafka reports its statistics every
    :data:`~kinbox.kafka.stats.DEFAULT_INTERVAL_MS` (``-X
    statistics.interval.ms`` changes it, 0 turns it off) and each report's
    partition lags go to the board.
    """
    overrides = dict(settings.kafka_overrides)
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # A new group must not skip events published before it first joined.
        "auto.offset.reset": "earliest",
        # Never hand a handler a record of a transaction its producer aborted
        # (or has not committed yet): an aborted record was never published.
        # librdkafka's default too, but kinbox's guarantees rest on it, so it
        # is set here, visibly; -X isolation.level=read_uncommitted overrides.
        "isolation.level": "read_committed",
        "max.poll.interval.ms": int(settings.max_poll_interval * 1000),
        "logger": logging.getLogger("kinbox.kafka"),
        **PREFETCH,
    }
    if overrides.get("group.protocol", "classic") == "classic":
        # Under KIP-848 (group.protocol=consumer) the broker owns these two
        # and librdkafka refuses them.
        config["session.timeout.ms"] = int(settings.session_timeout * 1000)
        # Cooperative: a rebalance moves only the partitions that change
        # owner, so the others keep flowing.
        config["partition.assignment.strategy"] = "cooperative-sticky"
    if lag is not None:
        config["statistics.interval.ms"] = DEFAULT_INTERVAL_MS
        config["stats_cb"] = on_stats(lag.update)
    config.update(overrides)
    return config


class KafkaTransport:
    """:class:`Transport` on a confluent-kafka ``Consumer``."""

    def __init__(
        self,
        settings: Settings,
        lag: LagBoard | None = None,
        on_wedged: Callable[[str], None] | None = None,
    ) -> None:
        """Create the consumer (it joins the group at :meth:`subscribe`).

        Args:
            settings: the worker's settings.
            lag: where each statistics report's partition lags go (see
                :func:`consumer_config`); ``None``: no statistics.
            on_wedged: called when a call into the client has not returned for
                twice the poll interval (see :mod:`kinbox.kafka.watch`);
                ``None`` only warns. ``kinbox worker`` exits there.

        Raises:
            ConfigurationError: librdkafka refused the configuration (``-X``).
        """
        config = consumer_config(settings, lag)
        self._log = ClientLog(config["logger"])
        config["logger"] = self._log
        # Only stored here: the binding may call it with an exception pending
        # (see kinbox.kafka.errors); poll() reads the outcomes after consume().
        config["on_commit"] = self._on_commit
        self._consumer = create_client(Consumer, config, "the consumer")
        self._listener: RebalanceListener | None = None
        self._answers: list[tuple[KafkaError | None, list[TopicPartition]]] = []
        # Per partition, the offset after the last record consume() returned
        # (see handed()); and the partitions whose assignment ended since a
        # poll's first consume() call.
        self._handed: dict[Partition, int] = {}
        self._ended: set[Partition] = set()
        self._owned: set[Partition] = set()  # assigned, not yet revoked or lost
        # A call may last a revoke's wait and a commit; one past the poll
        # interval has cost the member its place in the group already.
        interval = settings.effective_max_poll_interval
        self._watch = CallWatch(interval, 2 * interval, on_wedged)

    def _on_commit(self, err: KafkaError | None, parts: list[TopicPartition]) -> None:
        self._answers.append((err, parts))

    def _begin(self, partitions: list[Partition]) -> None:
        """An assignment of ``partitions`` begins: nothing returned for them yet."""
        for tp in partitions:
            self._handed.pop(tp, None)
        self._owned.update(partitions)

    def _end(self, partitions: list[Partition]) -> None:
        """The assignment of ``partitions`` ended (after the listener committed what it could)."""
        for tp in partitions:
            self._handed.pop(tp, None)
        self._ended.update(partitions)
        self._owned.difference_update(partitions)

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """See :meth:`Transport.subscribe`.

        The binding calls ``assign``/``incremental_assign`` (or the unassign
        pair) itself after each callback, choosing by the rebalance protocol
        in force (eager, cooperative or KIP-848). Python has no
        ``rebalance_protocol()`` to choose with here, so kinbox leaves that call
        to the binding and only does its offset bookkeeping in the callbacks.
        """
        self._listener = listener

        def assigned(_: Consumer, parts: list[TopicPartition]) -> None:
            self._begin(_pairs(parts))
            listener.on_assigned(_pairs(parts))

        def revoked(_: Consumer, parts: list[TopicPartition]) -> None:
            try:
                listener.on_revoked(_pairs(parts))
            finally:
                self._end(_pairs(parts))

        def lost(_: Consumer, parts: list[TopicPartition]) -> None:
            try:
                listener.on_lost(_pairs(parts))
            finally:
                self._end(_pairs(parts))

        try:
            self._consumer.subscribe(
                list(topics), on_assign=assigned, on_revoke=revoked, on_lost=lost
            )
        except KafkaException as exc:
            raise translate(f"subscribing to {list(topics)!r}", exc) from exc
        self._watch.start()

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """See :meth:`Transport.poll`; error events are logged, fatal ones raised.

        Waits at most ``timeout`` for the *first* record, then takes whatever
        else is already fetched, without waiting to fill ``max_messages``:
        at low load a record is handed over as soon as it arrives.

        That is two ``consume()`` calls, and librdkafka serves rebalance
        callbacks inside each. A revoke served by the second finds the
        partition's position moved past what the first returned already:
        :meth:`handed` counts those records before the second call, so the
        revoke never commits that position, and they are dropped if their
        partition's assignment ended. (Within one call, librdkafka moves
        positions only as the call returns, and its version barrier discards
        the records of an assignment that ended.)

        Raises:
            FatalTransportError: the consumer is fatally broken (e.g. fenced
                by another member with its ``group.instance.id``); its error
                event carries code ``_FATAL`` and the reason in its text.
        """
        # Wait for the first record only, then take what is buffered:
        # at low load a poll never waits to fill a batch.
        records = self._consume(1, timeout)
        if not records or max_messages <= 1:
            return records
        failpoint("poll_between_consumes")
        self._ended.clear()
        more = self._consume(max_messages - 1, 0)
        if self._ended:
            records = [r for r in records if (r.topic, r.partition) not in self._ended]
        return records + more

    def _consume(self, most: int, timeout: float) -> list[Record]:
        """One ``consume()`` call; its records, counted in :meth:`handed` before anything else."""
        try:
            with self._watch.call("polling"):
                messages = self._consumer.consume(most, timeout)
        except KafkaException as exc:
            raise translate("consuming", exc) from exc
        except SystemError as exc:
            raise FatalTransportError(f"consuming: {broken(exc, self._log)}") from exc
        finally:
            self._answer()
        records: list[Record] = []
        try:
            for msg in messages:
                err = msg.error()
                if err is None:
                    records.append(to_record(msg))
                elif is_fatal(err):
                    raise FatalTransportError(f"fatal consumer error: {describe(err)}")
                elif err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error (librdkafka retries): %s", err.str())
        finally:
            # The last record of a partition in a call is its highest offset
            # (indices, not field names: this runs for every record consumed).
            for tp, offset in {(r[0], r[1]): r[2] for r in records}.items():
                if offset >= self._handed.get(tp, 0):
                    self._handed[tp] = offset + 1
        return records

    def handed(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """See :meth:`Transport.handed`."""
        return {tp: self._handed[tp] for tp in partitions if tp in self._handed}

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """See :meth:`Transport.commit`."""
        if not offsets:
            return
        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        if asynchronous:
            try:
                with self._watch.call(f"committing {dict(offsets)} (asynchronously)"):
                    self._consumer.commit(offsets=parts, asynchronous=True)
            except KafkaException as exc:
                raise translate(f"committing {dict(offsets)}", exc) from exc
            return
        try:
            # No timeout in the binding: the watch is what bounds this wait.
            with self._watch.call(f"committing {dict(offsets)}"):
                result = self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise translate(f"committing {dict(offsets)}", exc) from exc
        for part in result:
            if part.error is not None:
                raise translate(
                    f"committing {part.topic}[{part.partition}]@{part.offset}",
                    KafkaException(part.error),
                )

    def _answer(self) -> None:
        """Tell the listener the outcome of each asynchronous commit answered meanwhile."""
        answers, self._answers = self._answers, []
        for err, parts in answers:
            failed: dict[Partition, int] = {}
            done: dict[Partition, int] = {}
            error = None
            for part in parts:
                problem = part.error or err
                if problem is None or problem.code() == KafkaError._NO_OFFSET:
                    done[(part.topic, part.partition)] = part.offset
                else:
                    failed[(part.topic, part.partition)] = part.offset
                    error = translate("committing (asynchronously)", KafkaException(problem))
            if self._listener is None:
                continue
            if done:
                self._listener.on_committed(done, None)
            if failed:
                self._listener.on_committed(failed, error)

    def pause(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`Transport.pause`."""
        self._call("pausing", self._consumer.pause, partitions)

    def resume(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`Transport.resume`."""
        self._call("resuming", self._consumer.resume, partitions)

    def seek(self, partition: Partition, offset: int) -> None:
        """See :meth:`Transport.seek`."""
        try:
            with self._watch.call(f"seeking {partition}@{offset}"):
                self._consumer.seek(TopicPartition(partition[0], partition[1], offset))
        except KafkaException as exc:
            raise translate(f"seeking {partition}@{offset}", exc) from exc

    def positions(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """See :meth:`Transport.positions`: librdkafka's application position.

        librdkafka moves it past the transaction markers it serves in a poll
        (since 1.4), which no committed ``last offset + 1`` ever reaches.
        """
        if not partitions:
            return {}
        try:
            with self._watch.call(f"reading the positions of {list(partitions)}"):
                parts = self._consumer.position([TopicPartition(t, p) for t, p in partitions])
        except KafkaException as exc:
            raise translate(f"reading the positions of {list(partitions)}", exc) from exc
        return {(tp.topic, tp.partition): tp.offset for tp in parts if tp.offset >= 0}

    def value_reader(self, deserializer: object) -> Callable[[Event], object]:
        """A reader of ``deserializer`` (see :class:`~kinbox.core.transport.ValueReading`)."""
        from kinbox.kafka.serde import reader  # loaded only for handlers registered with one

        return reader(deserializer)

    def close(self) -> None:
        """See :meth:`Transport.close`: leave the group inside polls, then close the client.

        What a poll of the leave returns is dropped: its partitions are being
        revoked, and their next owner reads it (:meth:`handed` counts it, so
        the revoke's commit stays below it).
        """
        if self._listener is not None:
            self._leave()
            self._listener = None
        self._watch.stop()  # close may outlast the watch's bound; the shutdown timer has it
        try:
            self._consumer.close()
        # SystemError: a fatal error met while close() ran a rebalance callback
        # (see kinbox.kafka.errors); the client is released all the same.
        except (KafkaException, RuntimeError, SystemError) as exc:
            log.warning("closing the consumer failed: %s", exc)

    def _leave(self) -> None:
        """Unsubscribe, and poll until every partition of the member is revoked (or lost).

        Gives up after :data:`LEAVE_WAIT`, or on an error (a fatally failed
        consumer refuses to unsubscribe): ``close()`` then revokes what is left.
        """
        try:
            with self._watch.call("unsubscribing"):
                self._consumer.unsubscribe()
        except (KafkaException, RuntimeError) as exc:
            log.debug("unsubscribing before close failed: %s", exc)
            return
        deadline = time.monotonic() + LEAVE_WAIT
        try:
            while self._owned and time.monotonic() < deadline:
                self._consume(10_000, _LEAVE_POLL)
        except TransportError as exc:
            log.debug("polling for the revoke before close failed: %s", exc)
        if self._owned:
            log.warning(
                "leaving the group: %d partition(s) not revoked after %.0fs; closing the "
                "consumer revokes them", len(self._owned), LEAVE_WAIT,
            )  # fmt: skip

    def _call(self, what: str, method: Any, partitions: Sequence[Partition]) -> None:
        try:
            with self._watch.call(f"{what} {list(partitions)}"):
                method([TopicPartition(t, p) for t, p in partitions])
        except KafkaException as exc:
            raise translate(f"{what} {list(partitions)}", exc) from exc


def to_record(msg: Message) -> Record:
    """Copy a consumed ``Message`` into a plain :class:`Record`; never raises.

    A record always becomes a ``Record``, whatever a producer wrote into it:
    one that raised here would end the poll loop, and the restarted worker
    would meet it again.
    """
    ts_type, ts = msg.timestamp()
    headers, headers_error = _headers(msg)
    # tuple.__new__ with every field, as namedtuple's own _make does (the
    # generated __new__ is one more Python call: 5% of the polling thread's
    # time in a replay), and no typing.cast(): this runs for every record
    # consumed. A consumed message always has its topic, partition and
    # offset; the stubs allow None for a producer's message.
    return _new_tuple(Record, (
        msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), headers,
        None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts, headers_error,
    ))  # fmt: skip


_new_tuple = tuple.__new__


def _headers(msg: Message) -> tuple[list[tuple[str, bytes | None]], str | None]:
    """The message's headers, or none and the reason they cannot be read.

    Kafka allows any bytes in a header name; confluent-kafka (2.16) decodes
    names as UTF-8 and, for one that is not, goes on with the error set: the
    list it returns (and caches) holds a missing item, and the error is either
    raised at once as ``SystemError`` or, once the interpreter has specialised
    the call site, left set until some later, unrelated C call raises it. So
    ``headers()`` is called through :func:`operator.methodcaller`: CPython
    checks what a C callable returns when it is called that way, whatever it
    specialised, and raises the error left set as ``SystemError`` right here
    (a ``ctypes`` call of ``PyErr_Occurred`` after each record did the same,
    at 9% of the polling thread's time in a replay). On failure none of the
    headers are used (the list must not be touched): the record then has no
    readable event id and the ``missing_id`` policy decides (dead-letter by
    default, with its key and value). Keys, values and header values are
    bytes and always readable; a NUL in a name ends it there.
    """
    try:
        headers = _read_headers(msg)
    except Exception as exc:
        _drain_errors_left_set()
        cause = exc.__cause__ or exc.__context__ or exc
        return [], f"{text.describe(cause, 200)} (a header name that is not UTF-8)"
    return headers or [], None


_read_headers = operator.methodcaller("headers")

# Called through ctypes, a CPython API function raises the error set in the
# interpreter, if any, as soon as it returns.
_raise_error_left_set = ctypes.pythonapi.PyErr_Occurred


def _drain_errors_left_set() -> None:
    """Raise and drop any error still set (belt and braces, only after a failed read)."""
    for _ in range(16):
        try:
            _raise_error_left_set()
            return
        except Exception:
            continue


def _pairs(parts: list[TopicPartition]) -> list[Partition]:
    return [(p.topic, p.partition) for p in parts]
