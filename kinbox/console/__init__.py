"""``kinbox console``: a web console for the people on call (the ``console`` extra).

What kinbox already knows — ``kinbox status``, ``kinbox explain``, the
dead-letter topics and their ``kinbox.dlq.*`` headers, the verdicts in
``processed_events``, the outbox's parked rows — as pages, with the actions
an operator takes on them: replay or discard dead letters, requeue or
discard parked outbox rows, release or discard parked keys. Every action is
recorded in PostgreSQL (:mod:`kinbox.store.decisions`).

Modules, from the data up to the web:

===============  ==============================================================
``settings``     :class:`ConsoleSettings`: address, token, actions, limits
``redact``       every secret the settings hold, masked wherever it would show
``fingerprint``  a dead letter's cause (reason, error type, group, topic), hashed
``preview``      headers and a payload as text safe to show, bounded
``letters``      reading the dead-letter topics, grouping them by cause
``overview``     a snapshot of groups, lag, dead letters, outbox and slots
``sampler``      the snapshots every few seconds, an hour of them for the charts
``charts``       a series as the points of an SVG line, no script needed
``parked``       parked keys of the inbox, behind a small interface
``decide``       the actions, each recorded before and after it runs
``state``        what the pages share while the console runs
``auth``         the access token, sessions, CSRF, read-only mode
``formats``      times, durations and sizes as the pages write them
``pages``        the pages (GET) and ``actions``: the forms (POST)
``app_support``  what both share: rendering, JSON, who asks
``app``          the Starlette application: routes, templates, headers
``serve``        running it under uvicorn
===============  ==============================================================

Nothing below the shell imports this package, and ``kinbox worker`` never
loads it: the ``kinbox console`` command imports it when it runs.
"""
