"""Middleware: layers around every partition batch (see :mod:`kinbox.middleware.base`).

=============  ================================================================
``base``       :class:`Middleware` (no-op hooks) and the chain that runs them
``telemetry``  OpenTelemetry spans and metrics (the only module that imports it)
=============  ================================================================
"""
