from __future__ import annotations

from typing import Any

import pytest

import kinbox
from kinbox.app import App
from kinbox.errors import ConfigurationError
from kinbox.event import Event

pytestmark = pytest.mark.unit


def test_registers_handlers_and_batch_form() -> None:
    app = App(group_id="g", batch_max_messages=50)

    @app.handler("a")
    def one(event: Event, tx: Any) -> None: ...

    @app.handler("b", batch=True)
    def many(events: list[Event], tx: Any) -> None: ...

    assert app.topics == ["a", "b"]
    assert app.routes["a"].fn is one and not app.routes["a"].batch
    assert app.routes["b"].batch
    s = app.settings({}, {})
    assert (s.group_id, s.batch_max_messages) == ("g", 50)


def test_duplicate_topic_fails_at_registration_naming_both() -> None:
    app = App()

    @app.handler("a")
    def first(event: Event, tx: Any) -> None: ...

    with pytest.raises(ConfigurationError, match=r"already has handler .*first.*second"):

        @app.handler("a")
        def second(event: Event, tx: Any) -> None: ...


def test_invalid_registrations() -> None:
    app = App()
    with pytest.raises(ConfigurationError, match="topic"):
        app.handler("bad topic!")
    with pytest.raises(ConfigurationError, match="callable"):
        app.handler("t")(42)  # type: ignore[type-var]
    with pytest.raises(ConfigurationError, match="unknown App setting"):
        App(group="g")


def test_bare_handler_registers_on_the_default_app() -> None:
    @kinbox.handler("test-default-app-topic")
    def fn(event: Event, tx: Any) -> None: ...

    assert kinbox.default_app.routes["test-default-app-topic"].fn is fn
