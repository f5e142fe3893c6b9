"""The handler registry: :class:`App`, and the bare :func:`handler` on a default app.

Decorating only records the function: no I/O, no connection. A topic
registered twice, an illegal topic name or a non-callable fails at import
with :class:`~kinbox.core.errors.ConfigurationError`, so a typo never reaches
production as a silently ignored handler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kinbox.apply.kinds import kind_for
from kinbox.apply.route import Ordering, Route
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError
from kinbox.core.names import topic_name
from kinbox.middleware.base import Middleware
from kinbox.params.wrap import prepare

F = TypeVar("F", bound=Callable[..., object])

Deserializer = Callable[..., object]
"""A ``value_deserializer``: ``bytes -> object``, or a confluent-kafka ``Deserializer``."""

_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))


def default_middleware() -> list[Middleware]:
    """The middleware an :class:`App` gets unless told otherwise: telemetry.

    Imported here, when the worker starts, not when a handler is registered:
    a module of handlers loads no OpenTelemetry.
    """
    from kinbox.middleware.telemetry import Telemetry

    return [Telemetry()]


class App:
    """A set of handlers and middleware, plus the app's own setting choices.

    Args:
        group_id: the Kafka consumer group, which is also the inbox's dedup
            scope: two apps with different group ids each apply an event once.
        middleware: the layers around every partition batch, in order (see
            :mod:`kinbox.middleware.base`); ``None`` means :func:`default_middleware`.
            A list replaces the defaults; :meth:`add_middleware` appends.
        value_deserializer: the default ``value_deserializer`` of this app's
            handlers that ask for a typed payload (see :meth:`handler`);
            handlers taking the :class:`~kinbox.core.event.Event` keep the raw value.
        **settings: any other :class:`~kinbox.core.config.Settings` field
            (``schema``, ``id_headers``, ``batch_max_messages``, ...); flags
            and ``KINBOX_*`` env override them.

    Raises:
        ConfigurationError: an unknown setting name, or middleware that is
            not a :class:`~kinbox.middleware.base.Middleware`.
    """

    def __init__(
        self,
        group_id: str | None = None,
        *,
        middleware: Sequence[Middleware] | None = None,
        value_deserializer: Deserializer | None = None,
        **settings: Any,
    ) -> None:
        unknown = set(settings) - _SETTING_NAMES
        if unknown:
            raise ConfigurationError(
                f"unknown App setting(s) {sorted(unknown)!r}; allowed: {sorted(_SETTING_NAMES)}"
            )
        if group_id is not None:
            settings["group_id"] = group_id
        self._defaults = settings
        self._value_deserializer = value_deserializer
        self._routes: dict[str, Route] = {}
        # None until first asked for: the defaults are made then (see middleware).
        self._resolved: list[Middleware] | None = None if middleware is None else []
        self._added: list[Middleware] = []
        for layer in middleware or ():
            self.add_middleware(layer)

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The middleware, in the order their ``before_*`` hooks run.

        Without ``middleware=`` the defaults (:func:`default_middleware`) come
        first; they are made on first access, which is when the worker starts.
        """
        if self._resolved is None:
            self._resolved = default_middleware()
        return (*self._resolved, *self._added)

    def add_middleware(self, middleware: Middleware) -> None:
        """Append ``middleware``: its ``before_*`` hooks run last, its ``after_*`` first.

        Raises:
            ConfigurationError: ``middleware`` is not a :class:`~kinbox.middleware.base.Middleware`.
        """
        if not isinstance(middleware, Middleware):
            raise ConfigurationError(
                f"{middleware!r} is not a kinbox Middleware (subclass kinbox.Middleware)"
            )
        self._added.append(middleware)

    @property
    def routes(self) -> Mapping[str, Route]:
        """Registered routes by topic."""
        return dict(self._routes)

    @property
    def key_connections(self) -> int:
        """Database connections the key-ordered routes use at most, beside the batches'."""
        return sum(r.concurrency for r in self._routes.values() if r.ordering == "key")

    @property
    def topics(self) -> list[str]:
        """Registered topics, sorted."""
        return sorted(self._routes)

    def handler(
        self,
        topic: str,
        *,
        batch: bool = False,
        max_attempts: int | None = None,
        dead_letter_topic: str | None = None,
        value_deserializer: Deserializer | None = None,
        ordering: Ordering = "partition",
        concurrency: int | None = None,
        park_keys: bool = False,
    ) -> Callable[[F], F]:
        """Register the decorated function for ``topic``; return it unchanged.

        What the function's parameters receive is read from its signature,
        now (:mod:`kinbox.params.signature`): ``(event: Event, tx)`` as
        always, or a typed payload first (``payload: Lesson``, decoded from
        the value: a pydantic model, a dataclass, ``dict``, ``bytes``,
        ``str``), plus any of ``event: Event``, ``tx`` and ``session: Session``
        (SQLAlchemy, in the inbox transaction). A payload that does not
        decode is dead-lettered at once with reason ``payload``. An ``async
        def`` function is awaited, with a psycopg ``AsyncConnection`` as its
        ``tx`` (or an ``AsyncSession``), in the same inbox transaction.

        Args:
            topic: a legal Kafka topic name, registered at most once per app.
            batch: the function takes ``(events, tx)`` — the fresh events of
                one partition batch — instead of ``(event, tx)`` (or
                ``list[Lesson]`` for typed payloads).
            max_attempts: tries before an event whose handler keeps failing
                goes to the dead-letter topic (default: the ``max_attempts``
                setting).
            dead_letter_topic: where dead letters go (default ``<topic>.dlq``).
            value_deserializer: turns the value into the payload before it is
                converted to the first parameter's type: a callable
                ``bytes -> object`` (any exception it raises dead-letters the
                event with reason ``payload``) or a confluent-kafka
                ``Deserializer`` (Schema Registry's Avro, Protobuf, JSON
                Schema). Default: the App's ``value_deserializer``.
            ordering: ``"partition"`` (default): a partition's records are
                applied one after the other. ``"key"``: each partition batch
                is split by record key, and the keys are applied side by
                side, each key's records in offset order, each key in a
                transaction of its own; records without a key keep partition
                order among themselves. A batch handler then gets one key's
                fresh events at a time (:mod:`kinbox.apply.keyed`).
            concurrency: with ``ordering="key"``, how many keys are applied
                at once (1..256, default 16), each on a database connection
                of its own.
            park_keys: once an event is dead-lettered, the later events of
                its record key are parked (kept in the database, not applied)
                until an operator replays or discards it (``kinbox dlq
                release`` / ``discard``), so a key's events are never applied
                out of order. Records without a key are never parked.
                Needs ``kinbox migrate``.

        Raises:
            ConfigurationError: illegal topic name, topic already registered,
                bad ``max_attempts``, ``ordering`` or ``concurrency``, or
                dead-letter topic, a parameter kinbox
                cannot fill or a payload type it cannot decode into, or the
                decorated object is not callable.
        """
        topic_name(topic, setting="handler topic")
        if max_attempts is not None and not (
            isinstance(max_attempts, int) and 1 <= max_attempts <= 1000
        ):
            raise ConfigurationError(
                f"@handler({topic!r}, max_attempts={max_attempts!r}) is not allowed: use 1..1000"
            )
        width = _concurrency(topic, ordering, concurrency)
        if not isinstance(park_keys, bool):
            raise ConfigurationError(
                f"@handler({topic!r}, park_keys={park_keys!r}): use True or False"
            )
        dlq = dead_letter_topic or f"{topic}.dlq"
        topic_name(dlq, setting=f"dead-letter topic of {topic!r}")
        if dlq == topic:
            raise ConfigurationError(
                f"@handler({topic!r}): the dead-letter topic must differ from the topic"
            )

        def register(fn: F) -> F:
            if not callable(fn):
                raise ConfigurationError(f"@handler({topic!r}) needs a callable, got {fn!r}")
            prepared = prepare(
                fn,
                batch=batch,
                where=f"@handler({topic!r})",
                value_deserializer=value_deserializer,
                default_deserializer=self._value_deserializer,
            )
            kind = kind_for(prepared, batch=batch)
            route = Route(
                topic, fn, kind, max_attempts, dead_letter_topic, ordering, width, park_keys
            )
            existing = self._routes.get(topic)
            if existing is not None:
                raise ConfigurationError(
                    f"topic {topic!r} already has handler {existing.name}; "
                    f"cannot register {route.name} too (one handler per topic)"
                )
            self._routes[topic] = route
            return fn

        return register

    def settings(
        self, flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Resolve settings: ``flags`` > ``KINBOX_*`` in ``env`` > this app's > defaults."""
        return Settings.load(flags, env, base=Settings(**self._defaults))

    def __repr__(self) -> str:
        return f"App(group_id={self._defaults.get('group_id')!r}, topics={self.topics!r})"


KEY_CONCURRENCY = 16
"""Keys applied at once by a key-ordered handler that does not say."""


def _concurrency(topic: str, ordering: object, concurrency: object) -> int:
    """The units a route applies at once, checked against its ``ordering``."""
    where = f"@handler({topic!r}"
    if ordering not in ("partition", "key"):
        raise ConfigurationError(
            f"{where}, ordering={ordering!r}) is not allowed: use 'partition' or 'key'"
        )
    if ordering == "partition":
        if concurrency is not None:
            raise ConfigurationError(
                f"{where}, concurrency={concurrency!r}) needs ordering='key': "
                "a partition's records are applied one after the other"
            )
        return 1
    if concurrency is None:
        return KEY_CONCURRENCY
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= 256
    ):
        raise ConfigurationError(
            f"{where}, concurrency={concurrency!r}) is not allowed: use 1..256"
        )
    return concurrency


default_app = App()
"""The app the bare :func:`handler` decorator registers on."""


def handler(
    topic: str,
    *,
    batch: bool = False,
    max_attempts: int | None = None,
    dead_letter_topic: str | None = None,
    value_deserializer: Deserializer | None = None,
    ordering: Ordering = "partition",
    concurrency: int | None = None,
    park_keys: bool = False,
) -> Callable[[F], F]:
    """Register the decorated function for ``topic`` on :data:`default_app`.

    See :meth:`App.handler`.
    """
    return default_app.handler(
        topic,
        batch=batch,
        max_attempts=max_attempts,
        dead_letter_topic=dead_letter_topic,
        value_deserializer=value_deserializer,
        ordering=ordering,
        concurrency=concurrency,
        park_keys=park_keys,
    )
