"""``kinbox outbox relay``: publish committed outbox rows to Kafka until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from types import FrameType

import click

from kinbox.otel.setup import configure as configure_telemetry
from producer_outbox.cli_support import connect, database_option, parse_overrides, redact
from producer_outbox.config import RelayConfig
from producer_outbox.publisher import KafkaPublisher, producer_config
from producer_outbox.relay import Relay

log = logging.getLogger("producer_outbox")


@click.command()
@database_option
@click.option(
    "--bootstrap-servers",
    envvar="KINBOX_BOOTSTRAP_SERVERS",
    default="localhost:9092",
    show_default=True,
    help="Kafka bootstrap servers [env KINBOX_BOOTSTRAP_SERVERS].",
)
@click.option("-X", "overrides", multiple=True, help="librdkafka property key=value (repeat).")
@click.option("--lanes", type=int, default=16, show_default=True, help="Same on every relay.")
@click.option("--batch-size", type=int, default=100, show_default=True)
@click.option("--poll-interval", type=float, default=1.0, show_default=True, help="Seconds.")
@click.option("--max-attempts", type=int, default=10, show_default=True)
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--cleanup-interval", type=float, default=3600.0, show_default=True)
@click.option("--source", default=None, help="CloudEvents ce_source (default /<topic>).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="KINBOX_METRICS_PORT",
    default=0,
    help="Serve Prometheus metrics at :PORT/metrics (needs kinbox[otel]; 0: none) "
    "[env KINBOX_METRICS_PORT]. Tracing and metrics also follow OTEL_*.",
)
@click.option("--log-level", default="INFO", show_default=True)
def relay(
    database_url: str,
    schema: str,
    bootstrap_servers: str,
    overrides: tuple[str, ...],
    lanes: int,
    batch_size: int,
    poll_interval: float,
    max_attempts: int,
    retention_days: float,
    cleanup_interval: float,
    source: str | None,
    metrics_port: int,
    log_level: str,
) -> None:
    """Publish committed outbox rows to Kafka until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Before the relay is made: its telemetry sees the SDK this sets up.
    turned_on = configure_telemetry("kinbox-outbox-relay", metrics_port)
    if turned_on:
        log.info("OpenTelemetry: %s", "; ".join(turned_on))
    config = RelayConfig(
        database_url=database_url,
        schema=schema,
        lanes=lanes,
        batch_size=batch_size,
        poll_interval=poll_interval,
        max_attempts=max_attempts,
        retention=timedelta(days=retention_days),
        cleanup_interval=cleanup_interval,
        source=source,
    ).validate()
    kafka_config = producer_config(bootstrap_servers, parse_overrides(overrides))
    connect(database_url, schema).close()  # fail fast: reachable and migrated
    publisher = KafkaPublisher(kafka_config)
    runner = Relay(config, publisher)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current batch, then stopping", signum)
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "outbox relay: kafka=%s database=%s schema=%s",
        bootstrap_servers,
        redact(database_url),
        schema,
    )
    try:
        runner.run()
    finally:
        publisher.close()
