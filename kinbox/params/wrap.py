"""The function a handler kind calls, ``(event, tx)`` or ``(events, tx)``, around the user's.

:func:`prepare` reads the handler's signature (:mod:`kinbox.params.signature`)
and builds, once, the function that decodes the payload, opens a session if
one is asked for, and calls the handler with each parameter filled. A handler
written the old way, ``(event, tx)``, is called unchanged: it costs nothing.
What only a driver can add — the SQLAlchemy session on the store's
connection, the reader of a confluent-kafka deserializer — is said as data on
the :class:`Prepared` value, and added when the worker starts
(:meth:`Prepared.bound`): registering a handler loads no driver.
For an ``async def`` handler the function returns what the handler returns,
a coroutine, which its kind awaits (the payload is decoded before, in the
call itself).
The kinds (:mod:`kinbox.apply.kinds`) never know the difference, so the
claim, the savepoints, the verdicts and the dead letters work as for any
handler; a payload that does not decode raises
:class:`~kinbox.core.errors.InvalidPayload` inside the call, where the kind judges
it like any failure (permanent: dead-lettered with reason ``payload``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore, Invoke, session_opener
from kinbox.core.transport import ValueReader
from kinbox.params.payload import Decode, decoder, from_kafka
from kinbox.params.signature import Parameters, awaits, parameters_of

# Where each source sits in the tuple of values a call has at hand.
_INDEX = {"payload": 0, "event": 1, "connection": 2, "session": 3}

Call = Callable[[Any, Any], object]
"""``call(event_or_events, tx)``: what a handler kind calls."""

Build = Callable[[ValueReader | None, Callable[[Invoke], Invoke] | None], Call]


@dataclass(frozen=True)
class Prepared:
    """A handler prepared at registration: the call its kind makes, and what the drivers add.

    A handler that takes an ORM session, or whose values a Kafka client
    library's deserializer reads, needs a driver's part before it can be
    called: :meth:`bound` adds it, once, when the worker's batch code is set
    up (:meth:`kinbox.apply.route.Route.bound`). Until then its :attr:`call`
    refuses to run.

    Attributes:
        call: ``(event, tx)`` or ``(events, tx)``; the function itself for a
            handler written that way.
        awaits: an ``async def`` handler: the call returns its coroutine.
        session: the SQLAlchemy session class it takes, if any; its store
            opens the session (:class:`~kinbox.core.inbox.SessionCapable`). Such a
            handler never runs pipelined: SQLAlchemy reads results at once.
        deserializer: the confluent-kafka ``Deserializer`` its values are read
            with, if any; the Kafka driver reads with it
            (:data:`~kinbox.core.transport.ValueReader`).
    """

    call: Call
    awaits: bool = False
    session: type | None = None
    deserializer: object | None = None
    build: Build | None = None
    """Makes the call from the drivers' parts; ``None`` when it needs none."""

    @property
    def unbound(self) -> bool:
        """Whether a driver's part is still missing (:meth:`bound` adds it)."""
        return self.build is not None

    def bound(self, store: InboxStore, value_reader: ValueReader | None) -> Prepared:
        """The handler with the drivers' parts it needs: ready to call.

        Args:
            store: the store its transactions run in: it opens the session.
            value_reader: the Kafka driver's reader of a deserializer's values.

        Raises:
            ConfigurationError: ``store`` opens no sessions, or no
                ``value_reader`` was given, and the handler needs it.
        """
        if self.build is None:
            return self
        if self.deserializer is not None and value_reader is None:
            raise ConfigurationError(
                f"a handler whose values {self.deserializer!r} reads needs the Kafka driver's "
                "reader (kinbox.kafka.serde.reader); none was given to the worker's batch code"
            )
        sessions = None if self.session is None else session_opener(store, self.session)
        call = self.build(value_reader, sessions)
        return Prepared(call, self.awaits, self.session, self.deserializer)


def prepare(
    fn: Callable[..., object],
    *,
    batch: bool,
    where: str,
    value_deserializer: object | None = None,
    default_deserializer: object | None = None,
) -> Prepared:
    """The ``(event, tx)`` (or ``(events, tx)``) function that calls ``fn`` as it asks.

    Args:
        fn: the handler, as registered.
        batch: it takes the fresh events of a partition batch as one list.
        where: ``@handler('topic')``, for error messages.
        value_deserializer: the handler's own deserializer.
        default_deserializer: the App's, used when the handler asks for a
            decoded payload and has none of its own.

    Raises:
        ConfigurationError: a parameter kinbox cannot fill, a payload type it
            cannot decode into, a deserializer that is not callable.
    """
    params = parameters_of(
        fn, batch=batch, where=where, deserializing=value_deserializer is not None
    )
    deserializer = value_deserializer
    if deserializer is None and params.payload is not None:
        deserializer = default_deserializer
    asynchronous = awaits(fn)
    if params.legacy:
        return Prepared(fn, asynchronous)
    build = _builder(fn, params, deserializer, batch=batch, where=where)
    kafka = deserializer if params.payload is not None and from_kafka(deserializer) else None
    if params.session is None and kafka is None:
        return Prepared(build(None, None), asynchronous)
    # Built now all the same, so a payload type kinbox cannot decode into
    # fails here, at registration, not when the worker starts.
    build(_not_yet, None)
    return Prepared(_unbound(fn, where), asynchronous, params.session, kafka, build)


def _builder(
    fn: Callable[..., object],
    params: Parameters,
    deserializer: object | None,
    *,
    batch: bool,
    where: str,
) -> Build:
    def build(read: ValueReader | None, sessions: Callable[[Invoke], Invoke] | None) -> Call:
        decode: Decode = _the_event
        if params.payload is not None:
            decode = decoder(params.payload, deserializer, where=where, read=read)
        invoke = _invoker(fn, params)
        if sessions is not None:
            invoke = sessions(invoke)
        call = _per_batch(decode, invoke) if batch else _per_event(decode, invoke)
        return functools.wraps(fn)(call)

    return build


def _not_yet(deserializer: object) -> Decode:
    """Stands in for the Kafka driver's reader at registration, to check the rest."""
    return _the_event


def _unbound(fn: Callable[..., object], where: str) -> Call:
    """The call of a handler that still needs a driver's part: it refuses to run."""

    @functools.wraps(fn)
    def call(subject: object, tx: object) -> object:
        raise ConfigurationError(
            f"{where}: the handler needs a driver's part (a session, a deserializer's "
            "reader), added when the worker's batch code is set up (Prepared.bound)"
        )

    return call


def _invoker(fn: Callable[..., object], params: Parameters) -> Invoke:
    positional = tuple(_INDEX[p.source] for p in params.params if not p.keyword)
    named = tuple((p.name, _INDEX[p.source]) for p in params.params if p.keyword)

    def invoke(payload: object, event: object, tx: Any, session: Any) -> object:
        values = (payload, event, tx, session)
        return fn(*[values[i] for i in positional], **{name: values[i] for name, i in named})

    return invoke


def _per_event(decode: Decode, invoke: Invoke) -> Call:
    def call(event: Event, tx: Any) -> object:
        # Decoded before anything touches the database: an invalid payload
        # costs no statement.
        return invoke(decode(event), event, tx, None)

    return call


def _per_batch(decode: Decode, invoke: Invoke) -> Call:
    def call(events: Sequence[Event], tx: Any) -> object:
        batch = list(events)
        return invoke([decode(e) for e in batch], batch, tx, None)

    return call


def _the_event(event: Event) -> Event:
    return event
