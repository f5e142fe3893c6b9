from __future__ import annotations

from typing import Any

import pytest

import kinbox
from kinbox.app import App
from kinbox.core.errors import ConfigurationError
from kinbox.core.event import Event

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


def test_dead_letter_options_are_validated_at_registration() -> None:
    app = App(group_id="g")

    @app.handler("a", max_attempts=3, dead_letter_topic="a-poison")
    def one(event: Event, tx: Any) -> None: ...

    @app.handler("b")
    def two(event: Event, tx: Any) -> None: ...

    assert (app.routes["a"].max_attempts, app.routes["a"].dlq_topic) == (3, "a-poison")
    assert app.routes["b"].dlq_topic == "b.dlq"
    for bad in (
        {"max_attempts": 0},
        {"dead_letter_topic": "no spaces"},
        {"dead_letter_topic": "c"},
    ):
        with pytest.raises(ConfigurationError):
            app.handler("c", **bad)


def test_failure_settings_are_validated() -> None:
    from kinbox.core.config import Settings

    base: dict[str, Any] = {"database_url": "postgresql:///x", "group_id": "g"}
    assert Settings(**base).validate().missing_id == "dead-letter"
    with pytest.raises(ConfigurationError, match="missing_id='skip'"):
        Settings(**base, missing_id="skip").validate()
    with pytest.raises(ConfigurationError, match="max_attempts=0"):
        Settings(**base, max_attempts=0).validate()
    loaded = Settings.load({}, {"KINBOX_MAX_ATTEMPTS": "9", "KINBOX_MISSING_ID": "derive"})
    assert (loaded.max_attempts, loaded.missing_id) == (9, "derive")
