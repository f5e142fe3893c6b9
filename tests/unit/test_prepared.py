"""What a handler needs of the drivers travels as data, and is added when the batch code starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.serialization import Deserializer
from sqlalchemy.orm import Session

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event
from kinbox.core.inbox import Invoke
from kinbox.testing import FakeStore, record

pytestmark = pytest.mark.unit


class Sessions(FakeStore):
    """A fake store that hands out a marker as each call's session."""

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        def around(invoke: Invoke) -> Invoke:
            def call(payload: object, event: object, tx: Any, _: Any) -> object:
                return invoke(payload, event, tx, ("session of", session_class))

            return call

        return around


class Upper(Deserializer):
    """A confluent-kafka deserializer: the Kafka driver reads with it."""

    def __call__(self, value: bytes | None, ctx: object = None) -> object:
        return (value or b"").upper()


def test_a_session_handler_says_so_and_its_call_waits_for_the_store() -> None:
    # Given a handler that takes a SQLAlchemy session, registered
    app = App("g")
    got: list[object] = []

    @app.handler("t")
    def handle(payload: bytes, session: Session) -> None:
        got.append(session)

    # When the batch code is set up over a store that opens sessions
    processor = BatchProcessor(app.routes, Sessions(), ("event-id",))
    result = processor.process([record("t", 0, 0, "e1")])

    # Then the handler got the store's session, and the registration alone did not
    assert result.applied == 1 and got == [("session of", Session)]
    with pytest.raises(ConfigurationError, match="needs a driver's part"):
        app.routes["t"].kind._fn(record_event(), None)  # type: ignore[attr-defined]


def test_a_store_that_opens_no_sessions_is_refused_when_the_batch_code_starts() -> None:
    app = App("g")

    @app.handler("t")
    def handle(payload: bytes, session: Session) -> None: ...

    with pytest.raises(ConfigurationError, match="Session needs an inbox store that opens"):
        BatchProcessor(app.routes, FakeStore(), ("event-id",))


def test_a_kafka_deserializer_is_read_by_the_reader_the_batch_code_is_given() -> None:
    # Given a handler whose values a confluent-kafka deserializer reads
    app = App("g")
    got: list[object] = []

    @app.handler("t", value_deserializer=Upper())
    def handle(payload: bytes, tx: Any) -> None:
        got.append(payload)

    # Then without the Kafka driver's reader the batch code refuses to start
    with pytest.raises(ConfigurationError, match="needs the Kafka driver's reader"):
        BatchProcessor(app.routes, FakeStore(), ("event-id",))

    # And with it the handler gets what the reader made of the value
    readers: list[object] = []

    def reader(deserializer: object) -> Callable[[Event], object]:
        readers.append(deserializer)
        return lambda event: b"read:" + event.value

    processor = BatchProcessor(app.routes, FakeStore(), ("event-id",), value_reader=reader)
    assert processor.process([record("t", 0, 0, "e1", b"v")]).applied == 1
    assert got == [b"read:v"] and [type(d) for d in readers] == [Upper]


def test_a_handler_that_needs_nothing_is_called_as_registered() -> None:
    app = App("g")

    @app.handler("t")
    def handle(event: Event, tx: Any) -> None: ...

    route = app.routes["t"]
    bound = BatchProcessor(app.routes, FakeStore(), ("event-id",))._routes["t"]
    assert bound is route and route.kind._fn is handle  # type: ignore[attr-defined]


def record_event() -> Event:
    return Event(id="e", topic="t", partition=0, offset=0, key=None, value=b"")
