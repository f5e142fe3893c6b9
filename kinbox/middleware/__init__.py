"""Middleware: layers around every partition batch (see :mod:`kinbox.middleware.base`).

=============  ================================================================
``base``       :class:`Middleware` (no-op hooks) and the chain that runs them
``telemetry``  OpenTelemetry spans and metrics of batches and handler calls
``spans``      the ``process <topic>`` span of a handler call: attributes, links, parent
``meters``     the worker's instruments and what each records
=============  ================================================================
"""
