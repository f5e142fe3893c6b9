"""``python -m benchmarks`` (``make bench``): the benchmark harness on a throwaway local stack.

Starts Apache Kafka and PostgreSQL through :mod:`kinbox.devstack` — PostgreSQL
with ``fsync`` on (every figure is for durable commits) and
``track_commit_timestamp`` on (the latency scenario reads each effect's real
commit time), and Kafka with the JVM's optimising compiler, warmed for two
minutes first (:mod:`benchmarks.warmup`; ``--quick`` does neither) — and
runs exactly what ``kinbox bench`` runs against a team's own cluster
(:mod:`kinbox.bench`). When the outbox scenario runs, a Kafka
Connect worker with Debezium joins them (the launcher of ``kinbox dev --cdc``;
PostgreSQL runs with ``wal_level=logical``), for the CDC contender;
``--no-cdc`` leaves it out. ``KINBOX_TEST_BOOTSTRAP`` /
``KINBOX_TEST_DATABASE_URL`` point it at existing services instead.

Writes ``bench.json``, ``bench.md`` and ``bench.png`` into ``--out``
(``benchmarks/results`` by default, replacing the last run's), which
``docs/benchmarks.md`` shows.
Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from benchmarks import warmup
from kinbox.bench.command import execute, new_prefix, select
from kinbox.bench.contenders import CONTENDERS
from kinbox.bench.scenarios import SCENARIOS
from kinbox.bench.spec import EVENT_IDS, PRODUCER_PROFILES, Sizes, Target
from kinbox.devstack.kafka import KafkaBroker
from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.stack import EXTERNAL_DATABASE_ENV, EXTERNAL_KAFKA_ENV, start_connect

RESULTS = Path(__file__).parent / "results"


@contextmanager
def stack(*, cdc: bool, steady: bool = True) -> Iterator[Target]:
    """The local Kafka and PostgreSQL (or the external ones named in the environment).

    ``cdc``: also a Kafka Connect worker with Debezium, started exactly as
    ``kinbox dev --cdc`` starts it, for the outbox scenario's CDC contender.
    ``steady``: a broker measured in its steady state — the optimising
    compiler, warmed up first; ``False`` (``--quick``) starts the tests'
    broker, quick to start and quick to finish.
    """
    with ExitStack() as cleanup:
        bootstrap = os.environ.get(EXTERNAL_KAFKA_ENV)
        url = os.environ.get(EXTERNAL_DATABASE_ENV)
        version = None
        if not url:
            postgres = PostgresServer(fsync=True, settings={"track_commit_timestamp": "on"})
            cleanup.callback(postgres.close)
            url = postgres.start().url
        if not bootstrap:
            # The optimising compiler, as a production broker runs, warmed
            # before the first run so that no contender pays for its compiling.
            kafka = KafkaBroker(quick_jit=not steady)
            cleanup.callback(kafka.close)
            bootstrap, version = kafka.start().bootstrap_servers, kafka.version
            if steady:
                print("warming the broker up ", file=sys.stderr, end="", flush=True)
                warmup.warm(bootstrap)
        connect_url = None
        if cdc:
            print("starting Kafka Connect with Debezium ...", file=sys.stderr)
            connect = start_connect(bootstrap)
            cleanup.callback(connect.close)  # callbacks run in reverse: Connect goes first
            connect_url = connect.rest_url
        yield Target(bootstrap, url, new_prefix(), kafka_version=version, connect_url=connect_url)


def main() -> None:
    """Parse the options, start the stack, run, write the results."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds per run)")
    parser.add_argument("--long", action="store_true", help="100M rows for the large scenario")
    parser.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS])
    parser.add_argument("--contender", action="append", choices=[c.name for c in CONTENDERS])
    parser.add_argument("--repeat", type=int, help="runs per contender and scenario")
    parser.add_argument("--events", type=int, help="events per run for the fast contenders")
    parser.add_argument("--outbox-rows", type=int, help="the outbox relay's backlog")
    parser.add_argument(
        "--latency-rate", type=int, action="append", help="offered events/s (repeatable)"
    )
    parser.add_argument(
        "--latency-producer", action="append", choices=PRODUCER_PROFILES,
        help="the feeding producer's profile (repeatable)",
    )  # fmt: skip
    parser.add_argument("--latency-seconds", type=float, help="duration of each latency run")
    parser.add_argument(
        "--stage-every", type=int, help="stamp the stages of 1 event in N (0: none)"
    )
    parser.add_argument(
        "--event-ids", choices=EVENT_IDS, help="random (the default) or time-ordered event ids"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where bench.* go")
    parser.add_argument(
        "--no-cdc", action="store_true", help="no Kafka Connect: the outbox relay runs alone"
    )
    args = parser.parse_args()
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.long:
        sizes = sizes.long()
    if args.repeat:
        sizes = replace(sizes, repeat=args.repeat)
    if args.events:
        sizes = replace(sizes, events=args.events)
    if args.outbox_rows:
        sizes = replace(sizes, outbox_rows=args.outbox_rows)
    if args.event_ids:
        sizes = replace(sizes, event_ids=args.event_ids)
    if args.latency_rate:
        sizes = replace(sizes, latency_rates=tuple(args.latency_rate))
    if args.latency_producer:
        sizes = replace(sizes, latency_producers=tuple(args.latency_producer))
    if args.latency_seconds:
        sizes = replace(sizes, latency_seconds=args.latency_seconds)
    if args.stage_every is not None:
        sizes = replace(sizes, stage_every=args.stage_every)
    scenarios, contenders = select(args.scenario or (), args.contender or ())
    cdc = not args.no_cdc and any(s.kind == "outbox" for s in scenarios)
    with stack(cdc=cdc, steady=not args.quick) as target:
        status = execute(target, sizes, scenarios, contenders, out_dir=args.out)
    sys.exit(status)


if __name__ == "__main__":
    main()
