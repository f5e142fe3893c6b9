"""``kinbox bench``: the benchmark scenarios against your own Kafka cluster and PostgreSQL.

It creates its own topics, consumer groups and schema under a unique prefix
(with ``--connect-url``, also a Debezium connector and its replication slot)
and removes them afterwards — also when interrupted (SIGINT/SIGTERM). The
local-stack entry point (``python -m benchmarks``) runs the same code through
:func:`execute`.
"""

from __future__ import annotations

import json
import secrets
import shutil
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from kinbox.bench.contenders import BY_NAME as CONTENDER_NAMES
from kinbox.bench.contenders import CONTENDERS, Contender
from kinbox.bench.scenarios import BY_NAME as SCENARIO_NAMES
from kinbox.bench.scenarios import SCENARIOS, Scenario
from kinbox.bench.spec import EVENT_IDS, PRODUCER_PROFILES, Sizes, Target
from kinbox.cli.support import EXIT_CONFIG, die, parse_kafka_overrides
from kinbox.core.errors import ConfigurationError, KinboxError

EXIT_FAILED = 1
"""A run failed its check (or did not finish): its figure is not reported."""
EXIT_INTERRUPTED = 130


def execute(
    target: Target,
    sizes: Sizes,
    scenarios: Sequence[Scenario],
    contenders: Sequence[Contender],
    *,
    out_dir: Path | None = None,
    json_path: str | None = None,
    progress: bool = True,
    log_dir: Path | None = None,
) -> int:
    """Run the benchmark, print the report, remove what it created; return the exit status."""
    from kinbox.bench import report
    from kinbox.bench.harness import Harness
    from kinbox.bench.resources import Interrupted, interruptible

    harness = Harness(target, sizes, scenarios, contenders, log_dir=log_dir, stream_bar=progress)
    click.echo(f"kinbox bench: prefix {target.prefix}, logs in {harness.log_dir}", err=True)
    status = 0
    left: list[str] = []
    try:
        with interruptible():
            try:
                outcome = harness.run()
            finally:
                left = harness.cleanup()
                if left:
                    click.echo("kinbox bench: could not remove: " + "; ".join(left), err=True)
    except Interrupted as exc:
        done = "some of its resources are left (above)" if left else "everything it made is removed"
        click.echo(f"kinbox bench: {exc}; {done}", err=True)
        shutil.rmtree(harness.log_dir, ignore_errors=True)
        return EXIT_INTERRUPTED
    data = report.to_json(target, sizes, outcome)
    text = report.markdown(data, outcome)
    if json_path == "-":
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        click.echo(text)
        if json_path:
            Path(json_path).write_text(json.dumps(data, indent=2, default=str) + "\n")
    if out_dir is not None:
        for path in report.write(data, outcome, out_dir):
            click.echo(f"wrote {path}", err=True)
    if outcome.failures:
        click.echo(
            f"kinbox bench: {len(outcome.failures)} run(s) FAILED their check; "
            f"no figure is reported for them (see above; logs in {harness.log_dir})",
            err=True,
        )
        status = EXIT_FAILED
    else:
        # Nothing to look into: the consumers' logs go with the run.
        shutil.rmtree(harness.log_dir, ignore_errors=True)
    return status


def select(
    scenarios: Sequence[str], contenders: Sequence[str]
) -> tuple[list[Scenario], list[Contender]]:
    """The scenarios and contenders named (all of each when none is)."""
    return (
        [SCENARIO_NAMES[s] for s in scenarios] if scenarios else list(SCENARIOS),
        [CONTENDER_NAMES[c] for c in contenders] if contenders else list(CONTENDERS),
    )


def new_prefix() -> str:
    """A prefix no other run uses: ``kinbox_bench_<8 hex>``."""
    return f"kinbox_bench_{secrets.token_hex(4)}"


@click.command("bench")
@click.option(
    "--bootstrap-servers",
    envvar="KINBOX_BOOTSTRAP_SERVERS",
    required=True,
    help="Kafka brokers [KINBOX_BOOTSTRAP_SERVERS].",
)
@click.option(
    "--database-url",
    envvar="KINBOX_DATABASE_URL",
    required=True,
    help="PostgreSQL URL; the user needs CREATE on the database [KINBOX_DATABASE_URL].",
)
@click.option(
    "-X",
    "kafka",
    multiple=True,
    metavar="KEY=VALUE",
    help="librdkafka property for every client, e.g. -X security.protocol=SASL_SSL.",
)
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice([s.name for s in SCENARIOS]),
    help="Run only these scenarios (repeatable; default: all).",
)
@click.option(
    "--contender",
    "contenders",
    multiple=True,
    type=click.Choice([c.name for c in CONTENDERS]),
    help="Run only these contenders (repeatable; default: all).",
)
@click.option("--quick", is_flag=True, help="Tiny sizes: proves everything runs, in minutes.")
@click.option(
    "--long",
    "long_mode",
    is_flag=True,
    help="100M rows in processed_events for the large-table scenario.",
)
@click.option("--events", type=click.IntRange(10), help="Events per run for the fast contenders.")
@click.option("--repeat", type=click.IntRange(1, 20), help="Runs per contender and scenario.")
@click.option("--kills", type=click.IntRange(0, 50), help="SIGKILLs per redelivery run.")
@click.option("--large-rows", type=click.IntRange(0), help="Rows preloaded for 'large'.")
@click.option(
    "--latency-rate",
    "latency_rates",
    multiple=True,
    type=click.IntRange(1),
    help="Offered events/s for 'latency' (repeatable; every producer profile runs at the "
    "first rate, the first profile at the others; default 1000 and 5000).",
)
@click.option(
    "--latency-producer",
    "latency_producers",
    multiple=True,
    type=click.Choice(PRODUCER_PROFILES),
    help="The feeding producer's settings for 'latency' (repeatable): plain (linger.ms=0) or "
    "idempotent (and enable.idempotence=true); default both.",
)
@click.option(
    "--latency-seconds", type=click.FloatRange(0.5), help="Duration of each 'latency' run."
)
@click.option(
    "--latency-window", type=click.FloatRange(0.1), help="Seconds per window of 'latency'."
)
@click.option(
    "--stage-every",
    type=click.IntRange(0),
    help="'latency': the kinbox worker stamps the stages of 1 event in N (0: no stamps).",
)
@click.option("--backlog-events", type=click.IntRange(10), help="1 KB events for 'memory'.")
@click.option("--outbox-rows", type=click.IntRange(10), help="The relay's backlog.")
@click.option(
    "--slow-events",
    type=click.IntRange(10),
    help="Records of 'slow-keys' (one partition, a 5 ms database wait per record).",
)
@click.option("--slow-keys", type=click.IntRange(1), help="Distinct record keys of 'slow-keys'.")
@click.option(
    "--key-concurrency",
    type=click.IntRange(1, 256),
    help="'slow-keys': keys applied at once by kinbox's key order and parallel-consumer "
    "(its maxConcurrency); default 16.",
)
@click.option(
    "--event-ids",
    type=click.Choice(EVENT_IDS),
    help="The events' ids: random (version-4 UUIDs, the default: the inbox's costly case) "
    "or time-ordered (version 7, as producer_outbox makes them).",
)
@click.option(
    "--connect-url",
    envvar="KINBOX_CONNECT_URL",
    metavar="URL",
    help="Kafka Connect REST address with Debezium's PostgreSQL connector (and kinbox's "
    "header transform): the outbox scenario then times Debezium beside the relay. The "
    "database needs wal_level=logical and a user with REPLICATION; a password in "
    "--database-url reaches Connect as ${env:KINBOX_DEBEZIUM_DATABASE_PASSWORD} (set it "
    "on the workers). Without it the CDC contender is skipped [KINBOX_CONNECT_URL].",
)
@click.option(
    "--connect-database-address",
    metavar="HOST[:PORT]",
    help="PostgreSQL's address as Kafka Connect reaches it, if not --database-url's.",
)
@click.option("--prefix", help="Name prefix of everything created (default: a random one).")
@click.option(
    "--kafka-version",
    metavar="VERSION",
    help="The brokers' version, for the report's header (brokers do not tell clients).",
)
@click.option(
    "--json",
    "json_path",
    metavar="PATH",
    help="Write the results as JSON to PATH ('-': to stdout instead of the table).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also write bench.json, bench.md and bench.png (matplotlib) here.",
)
def bench(
    bootstrap_servers: str, database_url: str, kafka: tuple[str, ...],
    scenarios: tuple[str, ...], contenders: tuple[str, ...], quick: bool, long_mode: bool,
    connect_url: str | None, connect_database_address: str | None, prefix: str | None,
    kafka_version: str | None, json_path: str | None, out_dir: Path | None,
    **sizes: int | float | str | tuple[Any, ...] | None,
) -> None:  # fmt: skip
    """Benchmark duplicate-delivery scenarios on your own Kafka cluster and PostgreSQL.

    Runs kinbox (per-event, batch, and with the inbox off), the article's
    per-event design, FastStream with a hand-written inbox, and a hand-written
    set-based consumer over the same events, and the outbox relay beside
    Debezium (with --connect-url); in 'slow-keys' (5 ms handlers, one
    partition, many keys) kinbox in partition and in key order beside
    Confluent's parallel-consumer (Java: needs mvn and a JDK). It checks
    every run's effects (exactly once, or at least once where that is all a
    contender promises) and prints events/s, latency, duplicates, peak RSS,
    CPU per event and the ratios between them.
    Everything it creates is named PREFIX... and removed at the end, also
    on Ctrl-C. Exit status: 0 all runs passed, 1 a run failed its check,
    130 interrupted.
    """
    chosen = Sizes.quick() if quick else Sizes()
    if long_mode:
        chosen = chosen.long()
    # A repeatable option given no value is an empty tuple: the default stays.
    given: dict[str, Any] = {k: v for k, v in sizes.items() if v is not None and v != ()}
    chosen = replace(chosen, **given)
    try:
        target = Target(
            bootstrap_servers=bootstrap_servers, database_url=database_url,
            prefix=prefix or new_prefix(), kafka=parse_kafka_overrides(kafka),
            connect_url=connect_url or None, connect_database_address=connect_database_address,
            kafka_version=kafka_version,
        )  # fmt: skip
    except ConfigurationError as exc:
        die(f"configuration error: {exc}", EXIT_CONFIG)
    try:
        status = execute(
            target, chosen, *select(scenarios, contenders), out_dir=out_dir, json_path=json_path,
        )  # fmt: skip
    except KinboxError as exc:
        die(str(exc), 1)
    sys.exit(status)
