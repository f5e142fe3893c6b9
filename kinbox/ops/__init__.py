"""Ops: the worker and the outbox relay as processes, and what an operator sees of them.

=================  ============================================================
``worker``         build the runner from settings, signals, graceful shutdown
``supervisor``     ``--processes N``: N members, one process each
``lifeline``       a child dies with its parent (``PR_SET_PDEATHSIG``)
``shutdown``       the bound on a graceful stop
``last_resort``    the bound's exit when no Python thread can run (a C timer)
``relay_process``  the outbox relay as a process: logs, telemetry, signals
``health``         ``/livez`` and ``/readyz`` (``--health-port``), fed by the loop
``logs``           text or ``--log-format json``, secrets masked
``exits``          exit statuses, and kinbox's errors turned into them
``group_lag``      a group's partitions as the broker sees them, oldest unprocessed
``status_report``  what ``kinbox status`` gathers, and its thresholds
``explanation``    what ``kinbox explain`` gathers
``dedup_window``   the window ``kinbox inbox cleanup`` must not cut into
=================  ============================================================

Where the inbox and the outbox meet (status, explain, the retention guards):
the shell's lower half, below the command line (:mod:`kinbox.cli`) and the
console, which import it; it imports neither.
"""
