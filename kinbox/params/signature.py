"""Which parameter of a handler gets what, decided from its signature at registration.

FastStream's convention: the first parameter is the message's body, decoded
into whatever its annotation names; the other parameters are recognised by
their annotation (FastStream's ``msg: KafkaMessage``). In kinbox::

    def h(event: Event, tx)                     the raw record, as always (also unannotated)
    def h(payload: Lesson, tx)                  the value decoded into Lesson
    def h(payload: Lesson, tx, event: Event)    both: a parameter annotated Event gets the event
    def h(payload: Lesson, session: Session)    a SQLAlchemy Session in the inbox transaction
    async def h(payload: Lesson, session: AsyncSession)   the same, awaited; tx: AsyncConnection
    def h(payload: Lesson)                      the payload alone

    @handler("t", batch=True)
    def hb(payloads: list[Lesson], tx, events: list[Event])

The rules, in order:

- The **first** parameter gets the payload: the :class:`~kinbox.core.event.Event`
  itself when it is annotated ``Event``, ``Any``, ``object`` or not at all
  (as before), else the record's value decoded into the annotation (see
  :mod:`kinbox.params.payload`). A batch handler's first parameter gets a list:
  ``list[Event]`` (or no annotation) for the events, ``list[T]`` for decoded
  payloads.
- Every **other** parameter gets what its annotation names: ``Event`` (in a
  batch handler ``list[Event]``) the event(s); a SQLAlchemy ``Session`` (or a
  subclass; an ``AsyncSession`` for an ``async def`` handler) a session bound
  to the inbox transaction (:mod:`kinbox.store.orm`); anything else that reads as a connection — no
  annotation, ``Any``, ``object``, a psycopg type, or an annotation that
  cannot be resolved at registration (an import under ``TYPE_CHECKING``) —
  the psycopg connection ``tx``; so does the second parameter whatever its
  annotation, as it always did.
- A parameter with a default value that kinbox cannot fill (a second
  connection, an annotation it does not know) keeps its default; without a
  default it is a :class:`~kinbox.core.errors.ConfigurationError` at import.

The classes are recognised without importing anything: a handler annotated
with a SQLAlchemy or pydantic class was defined in a module that imported
them, so they are found in ``sys.modules``; one that names neither loads neither.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event

Source = Literal["payload", "event", "connection", "session"]
"""What a parameter receives: the (decoded) payload, the Event, the connection, a session."""


@dataclass(frozen=True)
class Unresolved:
    """An annotation written as text that could not be evaluated at registration."""

    text: str


@dataclass(frozen=True)
class Param:
    """One parameter kinbox fills: its name, what it gets, and how it is passed."""

    name: str
    source: Source
    keyword: bool = False
    """Passed by name (a keyword-only parameter) instead of by position."""


@dataclass(frozen=True)
class Parameters:
    """How a handler is called: what each parameter gets, and the payload's type.

    Attributes:
        params: the parameters kinbox passes, in order.
        payload: the type the first parameter asks for (for a batch handler
            the list's item type); ``None`` when it takes the Event(s).
        session: the SQLAlchemy ``Session`` class to hand out, if any.
    """

    params: tuple[Param, ...]
    payload: object | None = None
    session: type | None = None

    @property
    def legacy(self) -> bool:
        """Whether the function is called exactly as before: ``fn(event, tx)``."""
        return self.payload is None and [(p.source, p.keyword) for p in self.params] == [
            ("event", False),
            ("connection", False),
        ]


LEGACY = Parameters((Param("event", "event"), Param("tx", "connection")))
"""``fn(event, tx)``: for callables whose signature cannot be read or that take ``*args``."""

_ANY = (Any, object, inspect.Parameter.empty)


def awaits(fn: Callable[..., object]) -> bool:
    """Whether ``fn`` is an ``async def`` handler (a function, a partial, a callable instance)."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the class's, not the instance's
    return not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def parameters_of(
    fn: Callable[..., object], *, batch: bool, where: str, deserializing: bool = False
) -> Parameters:
    """Read ``fn``'s signature: what each parameter gets.

    Args:
        fn: the handler.
        batch: whether it takes a partition batch's events as one list.
        where: ``@handler('topic')``, for error messages.
        deserializing: the handler has its own ``value_deserializer``: an
            unannotated first parameter gets what it returns, not the Event.

    Raises:
        ConfigurationError: a parameter kinbox cannot fill, or a first
            parameter whose annotation cannot be resolved.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an odd callable: call it as always
        return LEGACY
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return LEGACY
    hints = _resolve(fn, parameters)
    first = parameters[0]
    payload = _payload_type(hints[first.name], batch=batch, where=f"{where} {_name(first)}")
    if deserializing:
        payload = _deserialized(hints[first.name], payload, batch=batch, where=where)
    params = [Param(first.name, "event" if payload is None else "payload", _by_keyword(first))]
    session: type | None = None
    for parameter in parameters[1:]:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            if payload is None and len(params) == 1:
                return LEGACY  # fn(event, *rest) got tx in rest: keep calling it so
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        hint = hints[parameter.name]
        if isinstance(hint, Unresolved) and ("Session" in hint.text or "Event" in hint.text):
            # Taking it for the connection would hand a session's user a psycopg connection.
            _refuse(
                f"{where}: the annotation {hint.text!r} of {_name(parameter)} cannot be "
                "resolved; import it at module level (not under TYPE_CHECKING)"
            )
        source = _source(hint, batch=batch)
        if source is None and parameter is parameters[1] and not _names_events(hint):
            # The old second parameter, whatever its annotation (a team's own
            # connection Protocol, a fake's class): the connection, as always.
            source = "connection"
        if source == "connection" and any(p.source == "connection" for p in params):
            source = None  # a second connection: only a default may stand in for it
        if source == "session":
            session = _session_class(
                hints[parameter.name], where=f"{where} {_name(parameter)}", awaits=awaits(fn)
            )
            if any(p.source == "session" for p in params):
                source = None
        if source is None:
            if parameter.default is inspect.Parameter.empty:
                _refuse(_unknown(where, parameter, hints[parameter.name], batch=batch))
            continue
        params.append(Param(parameter.name, source, _by_keyword(parameter)))
    return Parameters(tuple(params), payload, session)


def _by_keyword(parameter: inspect.Parameter) -> bool:
    return parameter.kind is inspect.Parameter.KEYWORD_ONLY


def _name(parameter: inspect.Parameter) -> str:
    return f"parameter {parameter.name!r}"


def _refuse(message: str) -> typing.NoReturn:
    raise ConfigurationError(message)


def _payload_type(annotation: object, *, batch: bool, where: str) -> object | None:
    """The type the first parameter asks for, or ``None`` for the Event(s)."""
    annotation = strip(annotation)
    if isinstance(annotation, Unresolved):
        if "Event" in annotation.text:  # `event: "Event"` under TYPE_CHECKING: as before
            return None
        _refuse(
            f"{where}: its annotation {annotation.text!r} cannot be resolved, so kinbox cannot "
            "tell what to decode the payload into; import the type at module level "
            "(not under TYPE_CHECKING)"
        )
    if not batch:
        return None if annotation in (*_ANY, Event) else annotation
    if annotation in (*_ANY, Event, list, collections.abc.Sequence):
        return None  # the events, as before (``Event`` alone: a lenient old spelling)
    item = list_item(annotation)
    if item is None:
        _refuse(
            f"{where}: a batch handler's first parameter receives a list; annotate it "
            f"list[Event] or list[YourType], not {describe_type(annotation)}"
        )
    return None if strip(item) in (*_ANY, Event) else item


def _deserialized(annotation: object, payload: object | None, *, batch: bool, where: str) -> object:
    """The payload type of a handler with its own ``value_deserializer``."""
    if payload is not None:
        return payload
    item = list_item(strip(annotation)) if batch else annotation
    if strip(item) is Event or strip(annotation) is Event:
        _refuse(
            f"{where}: value_deserializer= is given, but the first parameter takes the Event, "
            "whose value stays bytes; annotate it with the payload's type (or leave it bare)"
        )
    return object


def _source(annotation: object, *, batch: bool) -> Source | None:
    """What a parameter after the first gets, from its annotation; ``None``: unknown."""
    annotation = strip(annotation)
    if isinstance(annotation, Unresolved) or annotation in _ANY:
        return "connection"
    if annotation is Event:
        return None if batch else "event"
    item = list_item(annotation)
    if item is not None and strip(item) is Event:
        return "event" if batch else None
    if _subclass_of(annotation, "sqlalchemy.orm", "Session") or _subclass_of(
        annotation, "sqlalchemy.ext.asyncio", "AsyncSession"
    ):
        return "session"
    origin = typing.get_origin(annotation) or annotation
    if str(getattr(origin, "__module__", "")).split(".")[0] == "psycopg":
        return "connection"
    return None


def _names_events(annotation: object) -> bool:
    """``Event`` or ``list[Event]``: an event parameter in the wrong kind of handler."""
    annotation = strip(annotation)
    item = list_item(annotation)
    return annotation is Event or (item is not None and strip(item) is Event)


def _session_class(annotation: object, *, where: str, awaits: bool) -> type:
    annotation = strip(annotation)
    assert isinstance(annotation, type)
    asynchronous = _subclass_of(annotation, "sqlalchemy.ext.asyncio", "AsyncSession")
    if asynchronous and not awaits:
        _refuse(
            f"{where}: an AsyncSession needs an async def handler; annotate a sync handler's "
            "parameter with sqlalchemy.orm.Session"
        )
    if awaits and not asynchronous:
        _refuse(
            f"{where}: an async def handler runs on an AsyncConnection, so its session is an "
            "AsyncSession; annotate the parameter with sqlalchemy.ext.asyncio.AsyncSession"
        )
    return annotation


def _unknown(where: str, parameter: inspect.Parameter, annotation: object, *, batch: bool) -> str:
    shown = describe_type(strip(annotation))
    events = "list[Event]" if batch else "Event"
    return (
        f"{where}: kinbox cannot fill {_name(parameter)} (annotated {shown}): only the first "
        f"parameter gets the payload; the others get the event(s) ({events}), a SQLAlchemy "
        "Session, or the connection (unannotated, Any or a psycopg type), at most one each"
    )


def strip(annotation: object) -> object:
    """``X`` for ``Annotated[X, ...]``; anything else unchanged."""
    if typing.get_origin(annotation) is typing.Annotated:
        return typing.get_args(annotation)[0]
    return annotation


def list_item(annotation: object) -> object | None:
    """``T`` for ``list[T]`` or ``Sequence[T]`` (``Any`` when bare), else ``None``."""
    origin = typing.get_origin(annotation)
    if origin in (list, collections.abc.Sequence):
        args = typing.get_args(annotation)
        return args[0] if args else Any
    return None


def _subclass_of(annotation: object, module: str, name: str) -> bool:
    """Whether ``annotation`` is a subclass of ``module.name``, if that module is loaded."""
    loaded = sys.modules.get(module)
    base = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(annotation, type) and isinstance(base, type) and issubclass(annotation, base)


def describe_type(annotation: object) -> str:
    """A type as the user wrote it, for messages: ``Lesson``, ``list[int]``, ``'Lesson'``."""
    if isinstance(annotation, Unresolved):
        return repr(annotation.text)
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _resolve(fn: Callable[..., object], parameters: list[inspect.Parameter]) -> dict[str, object]:
    """Each parameter's annotation, evaluated when written as text (``from __future__``).

    One at a time, so a name imported only under ``TYPE_CHECKING`` (often the
    connection's type) spoils only its own parameter: it becomes
    :class:`Unresolved`.
    """
    namespace = _globals(fn)
    out: dict[str, object] = {}
    for parameter in parameters:
        annotation = parameter.annotation
        if isinstance(annotation, str):
            try:
                # What typing.get_type_hints does with each string annotation.
                annotation = eval(annotation, dict(namespace))
            except Exception:
                annotation = Unresolved(parameter.annotation)
        out[parameter.name] = annotation
    return out


def _globals(fn: Callable[..., object]) -> Mapping[str, Any]:
    """The module namespace ``fn``'s annotations were written in."""
    target: object = fn
    for _ in range(100):  # partials of partials, decorators that set __wrapped__
        if isinstance(target, functools.partial):
            target = target.func
        elif hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        elif inspect.ismethod(target):
            target = target.__func__
        else:
            break
    if not inspect.isfunction(target) and not isinstance(target, type):
        target = inspect.getattr_static(type(target), "__call__", target)  # a callable instance
    return getattr(target, "__globals__", {})
