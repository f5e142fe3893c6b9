"""The function a handler kind calls, ``(event, tx)`` or ``(events, tx)``, around the user's.

:func:`prepare` reads the handler's signature (:mod:`kinbox.params.signature`)
and builds, once, the function that decodes the payload, opens a session if
one is asked for, and calls the handler with each parameter filled. A handler
written the old way, ``(event, tx)``, is returned unchanged: it costs nothing.
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
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from kinbox.core.event import Event
from kinbox.params.payload import Decode, decoder
from kinbox.params.signature import Plan, awaits, plan_for

# Where each source sits in the tuple of values a call has at hand.
_INDEX = {"payload": 0, "event": 1, "connection": 2, "session": 3}

Call = Callable[[Any, Any], object]
"""``call(event_or_events, tx)``: what a handler kind calls."""


def prepare(
    fn: Callable[..., object],
    *,
    batch: bool,
    where: str,
    value_deserializer: object | None = None,
    default_deserializer: object | None = None,
) -> Call:
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
    plan = plan_for(fn, batch=batch, where=where, deserializing=value_deserializer is not None)
    deserializer = value_deserializer
    if deserializer is None and plan.payload is not None:
        deserializer = default_deserializer
    if plan.legacy:
        return fn
    decode: Decode = _the_event
    if plan.payload is not None:
        decode = decoder(plan.payload, deserializer, where=where)
    invoke = _invoker(fn, plan)
    if plan.session is not None and awaits(fn):
        from kinbox.store.orm_async import AsyncSessions  # loaded only for handlers that ask

        invoke = AsyncSessions(plan.session).around(invoke)
    elif plan.session is not None:
        from kinbox.store.orm import Sessions  # loaded only for handlers that ask for one

        invoke = Sessions(plan.session).around(invoke)
    call = _per_batch(decode, invoke) if batch else _per_event(decode, invoke)
    wrapped = functools.wraps(fn)(call)
    if plan.session is not None:
        _WITH_SESSION.add(wrapped)
    return wrapped


# The prepared calls that open an ORM session (weakly held: a registry's only).
_WITH_SESSION: weakref.WeakSet[Callable[..., object]] = weakref.WeakSet()


def opens_session(call: Callable[..., object]) -> bool:
    """Whether ``call`` (from :func:`prepare`) hands its handler a SQLAlchemy session.

    Such a handler must not run under psycopg's pipeline mode: SQLAlchemy's
    own statements (its first-connect queries, a flush's RETURNING) read
    their results at once, which a pipeline defers, and fail there.
    """
    return call in _WITH_SESSION


Invoke = Callable[[object, object, Any, Any], object]
"""``invoke(payload, event, tx, session)``: calls the handler with its parameters filled."""


def _invoker(fn: Callable[..., object], plan: Plan) -> Invoke:
    positional = tuple(_INDEX[p.source] for p in plan.params if not p.keyword)
    named = tuple((p.name, _INDEX[p.source]) for p in plan.params if p.keyword)

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
