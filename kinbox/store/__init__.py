"""Store: where the inbox keeps ``processed_events``; PostgreSQL lives here and nowhere else.

It implements the seam of :mod:`kinbox.core.inbox` (:class:`InboxStore`,
:class:`InboxTransaction` and the async side), and imports only the core.

=====================  ========================================================
``postgres``           :class:`PostgresInboxStore`, on a psycopg_pool pool
``awaiting``           the store of async handlers, on an ``AsyncConnectionPool``
                       (a whole transaction run on its loop), and the worker's
                       :class:`MixedInboxStore`
``async_transaction``  one inbox transaction on an ``AsyncConnection``, and a
                       program's steps awaited in it
``transaction``        what both transactions send and how they judge the answers
``loop``               the event loop thread async handlers run on
``statements``         the inbox's SQL, named and rendered once per schema
``orm``                a SQLAlchemy ``Session`` bound to the inbox transaction
``orm_async``          the ``AsyncSession`` twin, for async handlers
``errors``             psycopg errors → :class:`~kinbox.core.errors.StoreError`: which are
                       outages, which are refusals of content (shared with
                       ``producer_outbox``'s writer)
``schema``             the inbox's tables, as versioned migration steps
``migrations``         applying versioned steps under an advisory lock (shared with
                       ``producer_outbox``)
``pruning``            deleting old ``processed_events`` rows in bounded batches
``inspect``            reading it for ``kinbox status`` and ``kinbox explain``, by index
``probe``              is the database reachable (``/readyz``)
=====================  ========================================================
"""
