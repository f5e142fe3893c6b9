"""Store: where the inbox keeps ``processed_events``; PostgreSQL lives here and nowhere else.

==============  ===============================================================
``base``        the seam: :class:`InboxStore` and :class:`InboxTransaction`
                (driver-free)
``postgres``    :class:`PostgresInboxStore`, on a psycopg_pool pool
``errors``      psycopg errors → :class:`~kinbox.errors.StoreError`: which are
                outages, which are refusals of content
``schema``      the inbox's tables, as versioned migration steps
``migrations``  applying versioned steps under an advisory lock (shared with
                ``producer_outbox``)
``retention``   deleting old ``processed_events`` rows in bounded batches
``inspect``     reading it for ``kinbox status`` and ``kinbox explain``, by index
``probe``       is the database reachable (``/readyz``)
==============  ===============================================================
"""
