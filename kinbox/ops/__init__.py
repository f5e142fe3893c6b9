"""Ops: running the worker as a process, for a service manager.

==============  ===============================================================
``worker``      build the runner from settings, signals, graceful shutdown
``supervisor``  ``--processes N``: N members, one process each
``lifeline``    a child dies with its parent (``PR_SET_PDEATHSIG``)
==============  ===============================================================
"""
