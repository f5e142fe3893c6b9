"""The loop thread async handlers run on: calls, context, stop and death."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from typing import Any

import pytest

from kinbox.core.errors import ThreadDied
from kinbox.store.loop import LoopThread


@pytest.fixture
def loop() -> Any:
    thread = LoopThread("test-loop")
    yield thread
    thread.stop()


def test_run_returns_the_result_and_raises_the_exception_itself(loop: LoopThread) -> None:
    async def ok() -> int:
        await asyncio.sleep(0)
        return 7

    error = ValueError("x")

    async def bad() -> None:
        raise error

    assert loop.run(ok()) == 7
    with pytest.raises(ValueError) as raised:
        loop.run(bad())
    assert raised.value is error


def test_the_coroutine_runs_on_the_loop_thread_with_the_callers_context(loop: LoopThread) -> None:
    var = contextvars.ContextVar("var", default="unset")
    var.set("caller")

    async def where() -> tuple[str, str]:
        return threading.current_thread().name, var.get()

    assert loop.run(where()) == ("test-loop", "caller")


def test_a_stopped_loop_refuses_and_run_from_the_loop_itself_refuses(loop: LoopThread) -> None:
    async def nested() -> None:
        loop.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="its own loop"):
        loop.run(nested())
    loop.stop()
    assert not loop.running
    with pytest.raises(RuntimeError, match="stopped"):
        loop.run(asyncio.sleep(0))


def test_a_loop_that_dies_fails_the_call_waiting_on_it_and_every_later_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a call waiting on a coroutine that will never end, and a thread
    # hook that hears of threads ending on an exception
    monkeypatch.setattr("kinbox.store.loop.LIVENESS_CHECK", 0.05)
    heard: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", heard.append)
    loop = LoopThread("dying-loop")
    outcome: list[BaseException] = []

    async def forever() -> None:
        await asyncio.Event().wait()

    def call() -> None:
        try:
            loop.run(forever())
        except BaseException as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=call, daemon=True)
    waiting.start()

    async def kill() -> None:
        # What asyncio lets end run_forever: SystemExit from a callback
        asyncio.get_running_loop().call_soon(sys.exit, 3)
        await asyncio.Event().wait()

    # When the loop's thread dies while the call waits
    with pytest.raises(ThreadDied):  # the killing call never gets an answer either
        loop.run(kill())
    waiting.join(10)
    # Then the waiting call fails, it does not wait forever, and says why
    assert not waiting.is_alive(), "the call still waits on a dead loop"
    (error,) = outcome
    assert isinstance(error, ThreadDied) and "SystemExit: 3" in str(error)
    # and a later call fails at once, the thread's end having been heard
    with pytest.raises(ThreadDied, match="died"):
        loop.run(asyncio.sleep(0))
    assert not loop.running
    assert [type(args.exc_value) for args in heard] == [ThreadDied]
    assert heard[0].thread is not None and heard[0].thread.name == "dying-loop"
