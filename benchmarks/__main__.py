"""``python -m benchmarks``: print throughput figures and ratios on the local stack.

The stack runs PostgreSQL with ``fsync`` on, so every figure is for durable
commits. Set ``KINBOX_TEST_BOOTSTRAP`` / ``KINBOX_TEST_DATABASE_URL`` to
measure against other services. Nothing here asserts a speed; it prints.
"""

from __future__ import annotations

import argparse

from benchmarks import inbox, outbox
from kinbox.devstack.stack import local_stack


def main() -> None:
    """Run the benchmarks and print a table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--events", type=int, default=30_000, help="events for kinbox runs")
    parser.add_argument("--naive-events", type=int, default=3_000, help="events for the naive run")
    parser.add_argument("--outbox-rows", type=int, default=20_000, help="rows for the relay run")
    parser.add_argument("--latency-samples", type=int, default=100, help="commits timed one by one")
    args = parser.parse_args()
    with local_stack(fsync=True) as stack:
        print(stack.describe())
        rows = inbox.run(
            stack.bootstrap_servers,
            stack.database_url,
            events=args.events,
            naive_events=args.naive_events,
        )
        relay = outbox.run(
            stack.bootstrap_servers,
            stack.database_url,
            rows=args.outbox_rows,
            samples=args.latency_samples,
        )
    baseline = rows[0][1] / rows[0][2]
    print(f"\n{'consumer':<52} {'events':>8} {'seconds':>8} {'events/s':>10} {'ratio':>7}")
    for name, count, seconds in rows:
        rate = count / seconds
        print(f"{name:<52} {count:>8} {seconds:>8.2f} {rate:>10.0f} {rate / baseline:>6.1f}x")
    print(f"\n{'outbox':<52} {'count':>8} {'value':>10}")
    for name, count, value, unit in relay:
        print(f"{name:<52} {count:>8} {value:>10.1f} {unit}")


if __name__ == "__main__":
    main()
