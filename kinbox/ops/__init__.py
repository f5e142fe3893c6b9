"""Ops: running the worker as a process, and what an operator sees of it.

==============  ===============================================================
``worker``      build the runner from settings, signals, graceful shutdown
``supervisor``  ``--processes N``: N members, one process each
``lifeline``    a child dies with its parent (``PR_SET_PDEATHSIG``)
``health``      ``/livez`` and ``/readyz`` (``--health-port``), fed by the loop
``logs``        text or ``--log-format json``, secrets masked
``lag``         a group's partitions as the broker sees them, oldest unprocessed
``status``      what ``kinbox status`` gathers, and its thresholds
``explain``     what ``kinbox explain`` gathers
``retention``   the dedup window ``kinbox inbox cleanup`` must not cut into
==============  ===============================================================
"""
