"""``kinbox outbox relay``: publish committed outbox rows to Kafka until SIGTERM/SIGINT.

The options are read here; the relay runs as a process of
:mod:`kinbox.ops.relay_process` (logs, telemetry, health, signals).
"""

from __future__ import annotations

from datetime import timedelta

import click

from kinbox.cli.outbox_support import connect, database_option, kafka_options, parse_overrides
from kinbox.ops import relay_process
from producer_outbox.config import RelayConfig
from producer_outbox.producer import producer_config


@click.command()
@database_option
@kafka_options("to publish to")
@click.option("--lanes", type=int, default=16, show_default=True, help="Same on every relay.")
@click.option(
    "--batch-size",
    type=int,
    default=1000,
    show_default=True,
    help="Rows per claim: per-batch costs (claim, mark, COMMIT) spread over more rows; "
    "a killed relay re-publishes about one batch per lane group.",
)
@click.option(
    "--parallel",
    type=int,
    default=2,
    show_default=True,
    help="Lane groups publishing side by side, each with its own PostgreSQL connection "
    "(plus one to LISTEN) and Kafka producer; 1 for a single loop.",
)
@click.option("--poll-interval", type=float, default=1.0, show_default=True, help="Seconds.")
@click.option("--max-attempts", type=int, default=10, show_default=True)
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--cleanup-interval", type=float, default=3600.0, show_default=True)
@click.option("--source", default=None, help="CloudEvents ce_source (default /<topic>).")
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    default=0,
    envvar="KINBOX_HEALTH_PORT",
    help="Serve /livez and /readyz on this port; 0: off [env KINBOX_HEALTH_PORT].",
)
@click.option(
    "--live-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    envvar="KINBOX_LIVE_TIMEOUT",
    help="Seconds without a turn of the loop before /livez fails; above the longest "
    "batch (a publish waits up to message.timeout.ms) [env KINBOX_LIVE_TIMEOUT].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="KINBOX_METRICS_PORT",
    default=0,
    help="Serve Prometheus metrics at :PORT/metrics (needs kinbox[otel]; 0: none) "
    "[env KINBOX_METRICS_PORT]. Tracing and metrics also follow OTEL_*.",
)
@click.option(
    "--log-level",
    default=None,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Default INFO (or kinbox --log-level).",
)
@click.option(
    "--log-format",
    default=None,
    envvar="KINBOX_LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    help="Default text (or kinbox --log-format) [env KINBOX_LOG_FORMAT].",
)
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
    health_port: int,
    live_timeout: float,
    metrics_port: int,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """Publish committed outbox rows to Kafka until SIGTERM/SIGINT."""
    relay_process.set_up(log_level, log_format, metrics_port)
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
    relay_process.run(
        config, kafka_config, bootstrap_servers, health_port=health_port, live_timeout=live_timeout
    )
