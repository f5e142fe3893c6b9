"""The transaction as a program: its steps, a wrapper's view of them, and async middleware."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kinbox.core.event import Event
from kinbox.core.inbox import drive
from kinbox.core.steps import Call, Claim, Seen, Step, Steps, SyncPipeline, pipelined, rewrite
from kinbox.middleware.base import Chain, Middleware
from kinbox.testing import FakeStore

pytestmark = pytest.mark.unit


def ev(event_id: str, offset: int = 0) -> Event:
    return Event(id=event_id, topic="t", partition=0, offset=offset, key=None, value=b"{}")


def test_a_wrapper_sees_each_step_its_result_and_its_failure() -> None:
    seen: list[tuple[str, object]] = []

    def noted(step: Step) -> Steps[Any]:
        try:
            value = yield step
        except Exception as exc:
            seen.append((type(step).__name__, repr(exc)))
            raise
        seen.append((type(step).__name__, value))
        return value

    def program(_tx: Seen) -> Steps[list[str]]:
        fresh = yield Claim([ev("a"), ev("a", 1), ev("b", 2)])
        with pytest.raises(RuntimeError, match="boom"):
            yield Call(_raises, "savepoint")
        return [e.id for e in fresh]

    store = FakeStore()
    assert store.run(lambda tx: rewrite(program(tx), noted)) == ["a", "b"]
    assert [name for name, _ in seen] == ["Claim", "Call"]
    assert seen[1][1] == "RuntimeError('boom')"
    assert store.commits == 1


def _raises(_connection: object) -> None:
    raise RuntimeError("boom")


def test_a_pipelined_block_left_by_a_failure_is_closed_and_the_failure_passes() -> None:
    store = FakeStore()

    def body() -> Steps[None]:
        yield Call(lambda conn: conn.effects.append("x"), "unguarded")
        assert (yield SyncPipeline()) is True
        raise ValueError("after the settle")

    with pytest.raises(ValueError, match="after the settle"):
        store.run(lambda _tx: pipelined(body()))
    assert store.pipelined == 1 and store.commits == 0 and store.effects == []


def test_drive_refuses_an_awaiting_call_without_a_way_to_await_it() -> None:
    made: list[Any] = []

    async def handler() -> None:
        return None

    def run(_connection: object) -> object:
        made.append(handler())
        return made[0]

    with pytest.raises(TypeError, match="awaits"), FakeStore().transaction() as tx:
        try:
            drive(lambda _tx: _one(Call(run, "unguarded", awaits=True)), tx)
        finally:
            made[0].close()


def _one(step: Step) -> Steps[object]:
    result: object = yield step
    return result


class SyncOnly(Middleware):
    """Wraps with a sync ``around_event`` only, noting the threads it sees."""

    def __init__(self, notes: list[str]) -> None:
        self.notes = notes

    def around_event(self, event: Event, call_next: Callable[[Event], object]) -> object:
        self.notes.append(f"sync before on {threading.get_ident()}")
        try:
            return call_next(event)
        finally:
            self.notes.append("sync after")


class Native(Middleware):
    """Wraps async calls on the loop itself."""

    def __init__(self, notes: list[str]) -> None:
        self.notes = notes

    async def around_event_async(
        self, event: Event, call_next: Callable[[Event], Awaitable[object]]
    ) -> object:
        self.notes.append(f"native before on {threading.get_ident()}")
        result = await call_next(event)
        self.notes.append("native after")
        return result


def test_async_calls_pass_every_layer_a_sync_only_one_from_a_thread_of_its_own() -> None:
    notes: list[str] = []
    chain = Chain([Native(notes), SyncOnly(notes)])

    async def call(event: Event) -> object:
        notes.append(f"handler on {threading.get_ident()}")
        return event.id

    async def main() -> object:
        notes.append(f"loop on {threading.get_ident()}")
        return await chain.around_event_async(ev("a"), call)

    assert asyncio.run(main()) == "a"
    loop = notes.pop(0).removeprefix("loop on ")
    assert notes[0] == f"native before on {loop}"
    assert notes[1].startswith("sync before on ") and notes[1] != f"sync before on {loop}"
    assert notes[2:] == [f"handler on {loop}", "sync after", "native after"]
