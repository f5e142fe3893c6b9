"""Apply: one partition batch in one database transaction, and the verdict on each record.

==============  ===============================================================
``envelope``    record → :class:`~kinbox.core.event.Event`: the event id
``route``       :class:`Route`: one registration (a leaf, imported by all)
``kinds``       how a registered function is called (per event, per batch, awaited)
``batch``       the transaction: claim, handlers, dead letters, COMMIT
``skim``        known duplicates dropped before any transaction
``dispatch``    calling the handlers, optimistically then carefully
``narrow``      content the database refuses, pinned on its event; dead
                letters sent between two transactions
``control``     the exceptions that carry a failure out of a transaction
``deadletter``  dead letters sent, and replayed
==============  ===============================================================

What a batch's outcome is (:mod:`kinbox.core.outcome`), what a dead letter
carries (:mod:`kinbox.core.letter`) and how long a partition waits after a
failure (:mod:`kinbox.core.policy`) are the shared vocabulary, in the core.
Driver-free, like :mod:`kinbox.consume`: the database is reached through
:mod:`kinbox.core.inbox`, Kafka through :mod:`kinbox.core.publisher`.
"""
