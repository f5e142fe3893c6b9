"""``kinbox bench``: duplicate-delivery scenarios, kinbox beside what teams write instead.

The harness runs every contender (:mod:`kinbox.bench.contenders`) over the
same events, in every scenario that applies to it (:mod:`kinbox.bench.scenarios`),
interleaved and repeated, against a Kafka cluster and a PostgreSQL database —
the local stack (``python -m benchmarks``) or a team's own (``kinbox bench``)::

    namespace (unique prefix: topics, schema, groups; removed at the end,
               also on SIGINT/SIGTERM)               resources
    ─► per scenario: produce the events               workload
    ─► per repetition, per contender (rotated):
         start the contender's consumer process(es)   process, child
         watch its committed offsets until the end    observe
         stop it, then check the effects: exactly
         once (or at least once, if that is all the
         contender promises) — a failed check is
         never a figure                               effects
    ─► median and spread per contender and scenario   results
    ─► header, JSON, markdown, PNG                    report

Every contender runs in its own process, so its peak RSS is its own, and a
kill between the database commit and the offset commit is a real SIGKILL.
Nothing here asserts a speed; it measures, checks and reports.
"""
