"""Typed handler parameters: what the signature asks for, how the payload is decoded."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
import pytest
from sqlalchemy.orm import Session
from typing_extensions import TypedDict  # pydantic needs it before Python 3.12

from kinbox.app import App
from kinbox.core.errors import ConfigurationError, DeadLetter, InvalidPayload, Retry
from kinbox.core.event import Event
from kinbox.params.signature import Param, parameters_of
from kinbox.params.wrap import prepare
from kinbox.testing import record

if TYPE_CHECKING:
    import psycopg  # only for the annotations: unresolvable when registered

from tests.unit.test_failures import Harness, T

pytestmark = pytest.mark.unit

W = "@handler('t')"


def event(value: bytes | str, offset: int = 7, **kw: Any) -> Event:
    raw = value.encode() if isinstance(value, str) else value
    return Event(id=f"e{offset}", topic="t", partition=0, offset=offset, key=None, value=raw, **kw)


class Lesson(pydantic.BaseModel):
    user_id: str = pydantic.Field(alias="userId")
    lesson_id: str = pydantic.Field(alias="lessonId")


@dataclasses.dataclass
class Step:
    n: int


@dataclasses.dataclass
class Course:
    name: str
    first: Step
    steps: list[Step]
    last: Step | None = None


class Point(TypedDict):
    x: int
    y: int


LESSON = '{"userId": "u1", "lessonId": "l1"}'


# --- what each parameter gets -------------------------------------------------------------


def sources(fn: Any, *, batch: bool = False) -> list[tuple[str, str, bool]]:
    return [(p.name, p.source, p.keyword) for p in parameters_of(fn, batch=batch, where=W).params]


def test_the_old_forms_are_called_unchanged() -> None:
    def plain(event, tx):  # type: ignore[no-untyped-def]
        ...

    def typed(event: Event, tx: Any) -> None: ...

    def late(event: Event, tx: psycopg.Connection[Any]) -> None: ...  # TYPE_CHECKING-only name

    def rest(event: Event, *args: Any) -> None: ...

    def batch(events: list[Event], tx: object) -> None: ...

    for fn in (plain, typed, late, rest):
        assert prepare(fn, batch=False, where=W).call is fn
    assert prepare(batch, batch=True, where=W).call is batch
    assert prepare(max, batch=False, where=W).call is max  # no signature to read: as before


def test_payload_then_parameters_by_annotation() -> None:
    def h(payload: Lesson, tx: Any, event: Event, *, session: Session) -> None: ...

    assert sources(h) == [
        ("payload", "payload", False),
        ("tx", "connection", False),
        ("event", "event", False),
        ("session", "session", True),
    ]
    plan = parameters_of(h, batch=False, where=W)
    assert plan.payload is Lesson and plan.session is Session


def test_order_is_free_after_the_first_and_tx_may_be_left_out() -> None:
    def h(payload: dict[str, Any], event: Event, tx: psycopg.Connection[Any]) -> None: ...

    def alone(payload: bytes) -> None: ...

    assert sources(h) == [
        ("payload", "payload", False),
        ("event", "event", False),
        ("tx", "connection", False),
    ]
    assert sources(alone) == [("payload", "payload", False)]


def test_batch_handlers_take_lists() -> None:
    def hb(payloads: list[Lesson], tx: Any, events: Sequence[Event]) -> None: ...

    plan = parameters_of(hb, batch=True, where=W)
    assert plan.payload is Lesson
    assert [p.source for p in plan.params] == ["payload", "connection", "event"]


class MySession(Session):
    pass


def test_annotated_and_subclassed_types_are_recognised() -> None:
    def h(payload: Annotated[Lesson, "doc"], s: MySession) -> None: ...

    plan = parameters_of(h, batch=False, where=W)
    assert plan.payload is Lesson and plan.session is MySession


def test_defaults_keep_their_value_when_kinbox_cannot_fill_them() -> None:
    def h(event: Event, tx: Any, retries: int = 3, other: Any = None) -> None: ...

    assert sources(h) == [("event", "event", False), ("tx", "connection", False)]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("def h(payload: Lesson, tx, count: int): ...", "cannot fill parameter 'count'"),
        ("def h(payload: Lesson, a, b): ...", "cannot fill parameter 'b'"),
        ("def h(payload: Lesson, events: list[Event]): ...", "cannot fill parameter 'events'"),
        ("def h(payload: Missing, tx): ...", "'Missing' cannot be resolved"),
        ("def h(payload: Lesson, s: AsyncSession): ...", "AsyncSession needs an async def handler"),
        ("async def h(payload: Lesson, s: Session): ...", "its session is an AsyncSession"),
        ("def h(payload: Lesson, s: NoSession): ...", "'NoSession' .* cannot be resolved"),
    ],
)
def test_what_cannot_be_filled_fails_at_registration(
    code: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sqlalchemy.ext.asyncio needs greenlet, which the sync tests do without: a
    # stand-in module is what the signature reader looks up in sys.modules.
    class AsyncSession:
        pass

    monkeypatch.setitem(
        sys.modules, "sqlalchemy.ext.asyncio", types.SimpleNamespace(AsyncSession=AsyncSession)
    )
    namespace: dict[str, Any] = {
        "Lesson": Lesson, "Event": Event, "AsyncSession": AsyncSession, "Session": Session,
        "__builtins__": __builtins__,
    }  # fmt: skip
    exec("from __future__ import annotations\n" + code, namespace)
    with pytest.raises(ConfigurationError, match=message):
        App("g").handler("t")(namespace["h"])


def test_a_batch_handler_must_take_a_list() -> None:
    def hb(payload: Lesson, tx: Any) -> None: ...

    def he(payloads: list[Lesson], event: Event) -> None: ...

    with pytest.raises(ConfigurationError, match="receives a list"):
        App("g").handler("t", batch=True)(hb)
    with pytest.raises(ConfigurationError, match="cannot fill parameter 'event'"):
        App("g").handler("t", batch=True)(he)


def test_callable_objects_and_partials_are_read_too() -> None:
    class Handler:
        def __call__(self, payload: Lesson, tx: Any) -> None: ...

    def h(prefix: str, payload: Step, tx: Any) -> None: ...

    assert parameters_of(Handler(), batch=False, where=W).payload is Lesson
    assert parameters_of(functools.partial(h, "x"), batch=False, where=W).payload is Step


# --- decoding ----------------------------------------------------------------------------


def decoded(annotation: Any, value: bytes | str, deserializer: Any = None) -> Any:
    got: list[Any] = []
    namespace: dict[str, Any] = {"T": annotation, "got": got}
    exec("def h(payload: T, tx):\n    got.append(payload)", namespace)
    prepare(namespace["h"], batch=False, where=W, value_deserializer=deserializer).call(
        event(value), None
    )
    return got[0]


def test_bytes_str_and_dict() -> None:
    assert decoded(bytes, b"\x00\xff") == b"\x00\xff"
    assert decoded(str, "héllo") == "héllo"
    assert decoded(dict, LESSON) == {"userId": "u1", "lessonId": "l1"}
    assert decoded(dict[str, Any], "{}") == {}


def test_a_pydantic_model_is_validated_from_json() -> None:
    lesson = decoded(Lesson, LESSON)
    assert isinstance(lesson, Lesson) and lesson.lesson_id == "l1"


def test_other_types_go_through_pydantic() -> None:
    assert decoded(list[int], "[1, 2]") == [1, 2]
    assert decoded(Point, '{"x": 1, "y": "2"}') == {"x": 1, "y": 2}


def test_a_dataclass_is_built_with_nested_ones_and_unknown_keys_ignored() -> None:
    value = {"name": "c", "first": {"n": 1}, "steps": [{"n": 2}], "last": None, "new": 1}
    assert decoded(Course, json.dumps(value)) == Course("c", Step(1), [Step(2)], None)


def test_optional_payloads_take_a_tombstone_as_none() -> None:
    assert decoded(Lesson | None, b"") is None
    assert decoded(Lesson | None, LESSON).user_id == "u1"


@pytest.mark.parametrize(
    ("annotation", "value", "why"),
    [
        (Lesson, '{"userId": "u1"}', "ValidationError"),
        (Lesson, b"", "ValidationError"),
        (Step, '{"m": 1}', "missing 1 required"),
        (Step, "[1]", "expected a JSON object"),
        (dict, "[1]", "expected a JSON object"),
        (dict, "not json", "JSONDecodeError"),
        (str, b"\xff", "UnicodeDecodeError"),
        (list[int], '["x"]', "ValidationError"),
    ],
)
def test_what_does_not_decode_is_an_invalid_payload(
    annotation: Any, value: bytes | str, why: str
) -> None:
    with pytest.raises(InvalidPayload, match=why) as caught:
        decoded(annotation, value)
    assert str(caught.value).startswith("t[0]@7: the payload is not a valid ")
    assert caught.value.__cause__ is not None


def test_a_value_deserializer_runs_first_then_the_annotation_converts() -> None:
    def upper(raw: bytes) -> dict[str, str]:
        return {"userId": raw.decode().upper(), "lessonId": "l"}

    assert decoded(Lesson, "abc", upper).user_id == "ABC"
    assert decoded(dict, "abc", upper) == {"userId": "ABC", "lessonId": "l"}
    assert decoded(Any, "abc", len) == 3
    with pytest.raises(InvalidPayload, match="the deserializer returned int, not str"):
        decoded(str, "abc", len)


def test_a_deserializer_exception_is_a_payload_failure_unless_it_is_kinbox_s_own() -> None:
    def broken(raw: bytes) -> object:
        raise ValueError("bad magic byte")

    def later(raw: bytes) -> object:
        raise Retry(2.0, "registry down")

    with pytest.raises(InvalidPayload, match="ValueError: bad magic byte"):
        decoded(Lesson, "x", broken)
    with pytest.raises(Retry):
        decoded(Lesson, "x", later)


def test_an_unannotated_payload_with_its_own_deserializer_gets_what_it_returns() -> None:
    got: list[Any] = []

    def h(payload, tx):  # type: ignore[no-untyped-def]
        got.append(payload)

    prepare(h, batch=False, where=W, value_deserializer=bytes.upper).call(event("abc"), None)
    assert got == [b"ABC"]


def test_the_app_default_deserializer_serves_typed_handlers_only() -> None:
    app = App("g", value_deserializer=lambda raw: {"userId": "from-app", "lessonId": "l"})
    got: list[Any] = []

    @app.handler("typed")
    def typed(payload: Lesson, tx: Any) -> None:
        got.append(payload.user_id)

    @app.handler("raw")
    def raw(event: Event, tx: Any) -> None:
        got.append(event.value)

    # (the kinds hold the prepared calls)
    assert app.routes["raw"].kind._fn is raw  # type: ignore[attr-defined]
    app.routes["typed"].kind._fn(event("x"), None)  # type: ignore[attr-defined]
    assert got == ["from-app"]


def test_deserializer_mistakes_fail_at_registration() -> None:
    def h(event: Event, tx: Any) -> None: ...

    def t(payload: Lesson, tx: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="first parameter takes the Event"):
        App("g").handler("t", value_deserializer=len)(h)
    with pytest.raises(ConfigurationError, match="not callable"):
        App("g").handler("t", value_deserializer=42)(t)  # type: ignore[arg-type]


def test_a_batch_decodes_every_event_and_fails_on_the_bad_one() -> None:
    got: list[Any] = []

    def hb(payloads: list[Step], events: list[Event]) -> None:
        got.append((payloads, [e.id for e in events]))

    call = prepare(hb, batch=True, where=W).call
    call([event('{"n": 1}', 1), event('{"n": 2}', 2)], None)
    assert got == [([Step(1), Step(2)], ["e1", "e2"])]
    with pytest.raises(InvalidPayload, match=r"t\[0\]@2"):
        call([event('{"n": 1}', 1), event("{}", 2)], None)


def test_invalid_payload_is_a_dead_letter() -> None:
    assert issubclass(InvalidPayload, DeadLetter)
    assert Param("x", "payload") == Param("x", "payload", False)


# --- through the runner, with fakes ------------------------------------------------------


def typed_app(**route: Any) -> App:
    app = App(group_id="g")

    @app.handler(T, **route)
    def apply(payload: Step, tx: Any, event: Event) -> None:
        tx.effects.append(f"{event.id}:{payload.n}")

    return app


def test_an_invalid_payload_is_dead_lettered_at_once_with_reason_payload() -> None:
    # Given a typed handler that may try each event five times
    h = Harness(typed_app(), max_attempts=5)
    h.add(record(T, 0, 0, "a", b'{"n": 1}'), record(T, 0, 1, "bad", b'{"m": 2}'))
    h.add(record(T, 0, 2, "c", b'{"n": 3}'))

    # When one turn runs
    h.run()

    # Then the bad payload is dead-lettered on its first try, the others applied around it
    assert h.store.effects == ["a:1", "c:3"]
    assert h.store.status == {"a": "applied", "bad": "dead_lettered", "c": "applied"}
    assert h.store.reasons["bad"].startswith("payload: InvalidPayload: ")
    headers = h.publisher.headers(0)
    assert headers["kinbox.dlq.reason"] == "payload"
    assert headers["kinbox.dlq.attempts"] == "1"
    assert headers["kinbox.dlq.error.type"] == "InvalidPayload"
    assert "missing 1 required positional argument: 'n'" in headers["kinbox.dlq.error.message"]
    assert h.committed == 3


def test_a_typed_batch_handler_dead_letters_only_the_bad_payload() -> None:
    app = App(group_id="g")

    @app.handler(T, batch=True)
    def apply(payloads: list[Step], tx: Any) -> None:
        tx.effects.extend(str(p.n) for p in payloads)

    h = Harness(app)
    h.add(*(record(T, 0, i, f"e{i}", b'{"n": %d}' % i) for i in range(3)))
    h.add(record(T, 0, 3, "bad", b"[]"), record(T, 0, 4, "e4", b'{"n": 4}'))
    h.run()
    assert h.store.effects == ["0", "1", "2", "4"]
    assert h.store.status["bad"] == "dead_lettered"
    assert h.publisher.headers(0)["kinbox.dlq.reason"] == "payload"
    assert h.committed == 5
