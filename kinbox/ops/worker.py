"""One worker process: load the app, wire the real store and transport, handle signals.

Signals: the first SIGTERM/SIGINT stops fetching; the batch in hand is
finished, its database transaction and then its offsets are committed, and
the consumer and pool are closed. If that takes longer than
``shutdown_timeout`` — or a second signal arrives — the process exits at
once; that is safe, because an offset is only ever committed after its
database transaction, so the next owner re-reads and the inbox suppresses
what was already applied.

Every other way a worker stops is bounded the same way and ends with its own
exit status (:mod:`kinbox.ops.exits`): the stop's clock starts with its first
reason (:class:`~kinbox.ops.shutdown.ShutdownBound`), and a batch still
running at the deadline is not waited for, its offsets not committed; the
process then exits without joining its thread (PostgreSQL rolls back its
transaction as the connection closes). The bound holds even while a thread
is stuck in C holding the GIL (:mod:`kinbox.ops.last_resort`). A kinbox
thread that dies stops the worker (:func:`~kinbox.ops.shutdown.watch_threads`).
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any

from kinbox.app import App, default_app
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, KinboxError, ThreadDied
from kinbox.core.lag import LagBoard
from kinbox.core.otel.instruments import metrics_on
from kinbox.core.otel.setup import configure as configure_telemetry
from kinbox.core.transport import Transport
from kinbox.kafka import KafkaPublisher, KafkaTransport, dead_letter_publisher
from kinbox.kafka.admin import check_dead_letter_topics
from kinbox.ops import last_resort, stamps
from kinbox.ops.exits import EXIT_CRASH, EXIT_FATAL, EXIT_INTERRUPTED, worker_status
from kinbox.ops.health import Health, HealthServer, ObservedTransport
from kinbox.ops.shutdown import ShutdownBound, exit_at_once, watch_threads
from kinbox.store.awaiting import MixedInboxStore
from kinbox.store.probe import ping

log = logging.getLogger(__name__)

EXIT_WEDGED = EXIT_FATAL
"""Exit status when the Kafka client stopped returning (the fatal client's)."""


SWITCH_INTERVAL = 0.001
"""Seconds a thread may hold the GIL while another waits for it (Python's default: 0.005).

A worker's threads mostly wait on sockets: the polling thread on the
consumer, each batch thread on its PostgreSQL connection. Each wait ends by
taking the GIL back, and while another thread is running Python that takes
up to the switch interval: with the default, the polling thread waits on the
GIL more than on the broker, and a replay on two cores is a fifth slower.
Set only where the process is kinbox's own (``kinbox worker``), and only if
nobody changed Python's default.
"""

_PYTHON_DEFAULT_SWITCH = 0.005


def shorten_switch_interval() -> bool:
    """Set :data:`SWITCH_INTERVAL` if the process still has Python's default; True if set."""
    if sys.getswitchinterval() != _PYTHON_DEFAULT_SWITCH:
        return False
    sys.setswitchinterval(SWITCH_INTERVAL)
    return True


GC_THRESHOLD = (50_000, 20, 10)
"""Collector thresholds ``kinbox worker`` sets (Python's default: ``(700, 10, 10)``).

A batch holds its records and events alive until it ends, and records wait
in the lanes for theirs: thousands of young container objects that outlive
several of the default's generation-0 collections each, so every batch paid
for collections that freed nothing. With 50,000 a collection comes every few
batches; the garbage the collector exists for (reference cycles) waits a
little longer, at most some megabytes of it.
"""

_PYTHON_DEFAULT_GC = (700, 10, 10)


def tune_gc() -> bool:
    """Set :data:`GC_THRESHOLD` if the process still has Python's default; True if set."""
    if not gc.isenabled() or gc.get_threshold() != _PYTHON_DEFAULT_GC:
        return False
    gc.set_threshold(*GC_THRESHOLD)
    return True


def freeze_start_up() -> None:
    """Move everything start-up built out of the collector's way (``gc.freeze``).

    Modules, the app, the clients and their connections live as long as the
    process: a full collection would walk them all again each time.
    """
    gc.collect()
    gc.freeze()


def load_app(target: str) -> App:
    """Import ``pkg.module[:attr]`` and return its :class:`App`.

    Without ``:attr``: the default app if the module registered bare
    ``@handler`` functions on it; else the module's ``app`` attribute if it is
    an ``App``; else the default app if modules it imported registered on it.

    Raises:
        ImportError: the module cannot be imported.
        ConfigurationError: ``attr`` is missing or not an ``App``, or there are no handlers.
    """
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    if attr:
        app = getattr(module, attr, None)
        if not isinstance(app, App):
            raise ConfigurationError(f"{target!r}: {attr!r} is not a kinbox App in {module_name}")
        return app
    routes = default_app.routes.values()
    # The default app is process-wide: only the module's own bare handlers make
    # it "this module's app" ahead of an explicit `app` attribute.
    if any(getattr(route.fn, "__module__", None) == module_name for route in routes):
        return default_app
    candidate = getattr(module, "app", None)
    if isinstance(candidate, App):
        return candidate
    if routes:
        return default_app
    raise ConfigurationError(
        f"{target!r} registers no handlers: use @handler(...), or name the app as {module_name}:app"
    )


def resolve(target: str, flags: Mapping[str, Any], env: Mapping[str, str]) -> tuple[App, Settings]:
    """Load the app and its validated settings (flags > env > app > defaults)."""
    app = load_app(target)
    return app, app.settings(flags, env).validate()


def resolve_target(target: str, flags: Mapping[str, Any]) -> tuple[App, Settings]:
    """Load ``kinbox worker``'s MODULE[:APP] and its validated settings (flags > env > app)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the app lives in the project
    return resolve(target, flags, os.environ)


def run(app: App, settings: Settings) -> None:
    """Run one group member in this process until a signal stops it.

    OpenTelemetry's SDK is set up first, from ``OTEL_*`` and
    ``settings.metrics_port`` (:mod:`kinbox.core.otel.setup`), so the middleware
    made below sees it.

    Raises:
        ConfigurationError: librdkafka refused the configuration, or the
            telemetry asked for cannot be set up.
        FatalTransportError: the consumer failed fatally.
    """
    shorten_switch_interval()
    tuned = tune_gc()
    turned_on = configure_telemetry("kinbox-worker", settings.metrics_port)
    if turned_on:
        log.info("OpenTelemetry: %s", "; ".join(turned_on))
    # The consumer's lag comes from librdkafka's statistics: only asked for
    # when an SDK takes the measurements.
    lag = LagBoard() if metrics_on() else None
    # The Kafka clients first: creating them checks the librdkafka
    # configuration and connects to nothing, so a bad -X is reported as such
    # even while the database is unreachable.
    transport = KafkaTransport(settings, lag, on_wedged=_wedged)
    try:
        # A diagnostic, off unless KINBOX_STAGE_STAMPS is set (kinbox.ops.stamps).
        stamped = stamps.install(transport, app.add_middleware)
    except BaseException:
        transport.close()
        raise
    store = MixedInboxStore(
        settings.database_url,
        schema=settings.schema,
        consumer=settings.group_id,
        # A key-ordered route applies its keys side by side, each on a
        # connection of its own, beside the partition batches' connections.
        pool_size=settings.pool_size + app.key_connections,
    )
    publisher: KafkaPublisher | None = None
    try:
        # Before the first record: a dead letter the broker can never take
        # would hold its partition, so a missing or unwritable dead-letter
        # topic is a configuration error now, not a stall later.
        targets = {route.topic: route.dlq_topic for route in app.routes.values()}
        limits = {
            name: topic.max_bytes
            for name, topic in check_dead_letter_topics(settings, targets).items()
        }
        publisher = dead_letter_publisher(
            settings, max_record_bytes=max(limits.values(), default=None)
        )
        store.open()
    except BaseException:
        store.close()
        if publisher is not None:
            publisher.close()
        transport.close()
        raise
    health = _serve_health(settings)
    observed: Transport = stamped if health is None else ObservedTransport(stamped, health[0])
    bound = ShutdownBound(settings.shutdown_timeout, last_resort=last_resort.arm)

    def stopping(error: BaseException | None) -> None:
        if error is None:
            bound.begin(EXIT_INTERRUPTED, "stop")
        else:
            bound.begin(worker_status(error), type(error).__name__)

    runner = Runner(
        app, settings, observed, store, publisher=publisher, dead_letter_limits=limits, lag=lag,
        on_stopping=stopping, value_reader=transport.value_reader,
    )  # fmt: skip
    _install_signals(runner, bound)
    watch_threads(lambda died: _thread_died(runner, bound, died))
    log.info("starting with %r", settings)
    if tuned:
        freeze_start_up()
    error: BaseException | None = None
    try:
        runner.run()
    except BaseException as exc:
        error = exc
    finally:
        if health is not None:
            health[1].close()
    _end(error, runner.unfinished())


def _end(error: BaseException | None, unfinished: int) -> None:
    """Return (a clean stop), let ``error`` reach the CLI, or end the process, as ``error`` says.

    With batches still running the process ends at once (its exit would join
    their threads); else the CLI reports kinbox's own errors, and anything
    else ends it here with the worker's status for it.
    """
    status = EXIT_INTERRUPTED if error is None else worker_status(error)
    if unfinished:
        log.error(
            "exiting with status %d, %d batch(es) still running (their transactions roll back "
            "as the process's connections close)",
            status, unfinished,
        )  # fmt: skip
        exit_at_once(status)
    if error is None:
        return
    if isinstance(error, (ImportError, KinboxError)):
        raise error  # the CLI says it, with its status
    log.error("exiting with status %d", status)
    sys.exit(status)


def _thread_died(runner: Runner, bound: ShutdownBound, died: ThreadDied) -> None:
    bound.begin(EXIT_CRASH, "a thread died")
    runner.stop(died)


def _serve_health(settings: Settings) -> tuple[Health, HealthServer] | None:
    """``/livez`` and ``/readyz`` on ``settings.health_port``, if it is set."""
    if not settings.health_port:
        return None
    health = Health(
        settings.effective_live_timeout,
        "partitions",
        database=lambda: ping(settings.database_url),
    )
    return health, HealthServer(health, settings.health_port).start()


def _install_signals(runner: Runner, bound: ShutdownBound) -> None:
    def on_signal(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if runner.stopping:
            log.warning("second %s: exiting now", name)
            exit_at_once(EXIT_INTERRUPTED)
        log.info("%s: finishing the batch in hand, then stopping", name)
        bound.begin(EXIT_INTERRUPTED, name)
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _wedged(reason: str) -> None:
    """The consumer is stuck inside librdkafka for good: exit, so a fresh client takes over.

    The stuck call holds the polling thread, so nothing can be closed or
    committed cleanly; offsets already committed stay valid and the inbox
    suppresses whatever the next owner reads again.
    """
    log.error("exiting with status %d: %s", EXIT_WEDGED, reason)
    exit_at_once(EXIT_WEDGED)
