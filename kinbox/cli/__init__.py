"""The ``kinbox`` command line: one module per command group.

===========  ==================================================================
``main``     the ``kinbox`` group, ``worker`` and ``migrate``; mounts the rest
``support``  exit codes, ``-X`` parsing, settings from the common options
``ops``      ``kinbox dlq`` and ``kinbox inbox`` (operator commands)
``status``   ``kinbox status``; ``explain``: ``kinbox explain``
``console``  ``kinbox console`` (the web console, the ``console`` extra)
``outbox``   ``kinbox outbox`` and its commands (``outbox_*``), over the
             :mod:`producer_outbox` library
===========  ==================================================================

What the commands run (the worker and relay processes, status, explain,
the retention guards) is in :mod:`kinbox.ops`; the CLI is the floor above it.
"""
