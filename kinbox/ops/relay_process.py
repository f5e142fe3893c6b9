"""The outbox relay as a process: its logs, telemetry and health endpoints, and its signals.

``kinbox outbox relay`` (:mod:`kinbox.cli.outbox_relay`) reads the options;
this module runs :class:`~producer_outbox.relay.Relay` the way
:mod:`kinbox.ops.worker` runs the inbox's worker: logs and OpenTelemetry set
up first (:func:`set_up`), then ``/livez`` and ``/readyz`` on
``--health-port``, and SIGTERM/SIGINT settling the rows in flight before the
relay stops (:func:`run`).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping
from types import FrameType

from kinbox.core.config import redact_url
from kinbox.core.otel.setup import configure as configure_telemetry
from kinbox.ops.health import Health, HealthServer
from kinbox.ops.logs import configure as configure_logs
from kinbox.store.probe import ping
from producer_outbox.config import RelayConfig
from producer_outbox.producer import relay_publisher
from producer_outbox.relay import Relay
from producer_outbox.sent_retention import broker_retention

log = logging.getLogger("producer_outbox")


def set_up(log_level: str | None, log_format: str | None, metrics_port: int) -> None:
    """Logging (``--log-level``/``--log-format``), then OpenTelemetry from ``OTEL_*``."""
    # Given here, they win over the kinbox group's; else that one's stand.
    configure_logs(log_level, log_format or "text", force=bool(log_level or log_format))
    # Before the relay is made: its telemetry sees the SDK this sets up.
    turned_on = configure_telemetry("kinbox-outbox-relay", metrics_port)
    if turned_on:
        log.info("OpenTelemetry: %s", "; ".join(turned_on))


def run(
    config: RelayConfig,
    kafka_config: Mapping[str, str],
    bootstrap_servers: str,
    *,
    health_port: int,
    live_timeout: float,
) -> None:
    """Publish committed outbox rows with ``config`` until SIGTERM/SIGINT.

    Args:
        config: the relay's validated settings.
        kafka_config: the Kafka producer's configuration.
        bootstrap_servers: the brokers, for the start-up line.
        health_port: serve ``/livez`` and ``/readyz`` here (0: off).
        live_timeout: seconds without a turn of the loop before ``/livez`` fails.
    """
    publisher = relay_publisher(kafka_config)
    health = Health(live_timeout, "lanes", database=lambda: ping(config.database_url))
    server = HealthServer(health, health_port).start() if health_port else None
    runner = Relay(
        config, publisher, observer=health, topic_retention=broker_retention(kafka_config)
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: settling the rows in flight, then stopping", signum)
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "outbox relay: kafka=%s database=%s schema=%s",
        bootstrap_servers,
        redact_url(config.database_url),
        config.schema,
    )
    try:
        runner.run()
    finally:
        publisher.close()
        if server is not None:
            server.close()
