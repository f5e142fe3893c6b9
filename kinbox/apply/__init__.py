"""Apply: one partition batch in one database transaction, and the verdict on each record.

==============  ===============================================================
``route``       :class:`Route`: one registration (a leaf, imported by all)
``outcome``     :class:`BatchResult` and :class:`Failure` (a leaf)
``batch``       the transaction: claim, handlers, dead letters, COMMIT
``dispatch``    calling the handlers, optimistically then carefully
``narrow``      content the database refuses, pinned on its event; dead
                letters sent between two transactions
``deadletter``  dead letters: their headers, sending, replay
``policy``      how long a partition waits after a failure to retry
==============  ===============================================================

Driver-free, like :mod:`kinbox.consume`: the database is reached through
:mod:`kinbox.store.base`, Kafka through :mod:`kinbox.kafka.base`.
"""
