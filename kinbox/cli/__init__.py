"""The ``kinbox`` command line: one module per command group.

===========  ==================================================================
``main``     the ``kinbox`` group, ``worker`` and ``migrate``; mounts the rest
``support``  exit codes, logging, ``-X`` parsing, turning errors into exits
``ops``      ``kinbox dlq`` and ``kinbox inbox`` (operator commands)
===========  ==================================================================

``kinbox dev`` lives in :mod:`kinbox.devstack.command`, ``kinbox bench`` in
:mod:`kinbox.bench.command`, ``kinbox outbox`` in :mod:`producer_outbox.cli`.
"""
