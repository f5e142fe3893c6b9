"""``kinbox outbox relay``: publish committed outbox rows to Kafka until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from types import FrameType

import click

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
@click.option(
    "--batch-size",
    type=int,
    default=1000,
    show_default=True,
    help="Rows per claim: per-batch costs (claim, mark, COMMIT, flush) spread over more rows; "
    "a killed relay re-publishes at most one batch.",
)
@click.option(
    "--parallel",
    type=int,
    default=2,
    show_default=True,
    help="Lane groups publishing side by side, each with its own PostgreSQL connection "
    "(plus one to LISTEN) and Kafka producer; 1 for one batch at a time.",
)
@click.option("--poll-interval", type=float, default=1.0, show_default=True, help="Seconds.")
@click.option("--max-attempts", type=int, default=10, show_default=True)
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--cleanup-interval", type=float, default=3600.0, show_default=True)
@click.option("--source", default=None, help="CloudEvents ce_source (default /<topic>).")
@click.option("--log-level", default="INFO", show_default=True)
def relay(
    database_url: str,
    schema: str,
    bootstrap_servers: str,
    overrides: tuple[str, ...],
    lanes: int,
    batch_size: int,
    parallel: int,
    poll_interval: float,
    max_attempts: int,
    retention_days: float,
    cleanup_interval: float,
    source: str | None,
    log_level: str,
) -> None:
    """Publish committed outbox rows to Kafka until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = RelayConfig(
        database_url=database_url,
        schema=schema,
        lanes=lanes,
        batch_size=batch_size,
        parallel=parallel,
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
