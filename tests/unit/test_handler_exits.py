"""A handler's ``BaseException`` is settled where it is raised, sync or async.

``SystemExit`` and ``KeyboardInterrupt`` ask the process to stop: the
worker stops (:class:`~kinbox.core.errors.ExitRequested`), its batch rolled back.
Anything else is a failed try of the event, like any exception
(:class:`~kinbox.core.errors.HandlerAborted`): one event never stops the worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinbox.app import App
from kinbox.core.errors import ExitRequested
from kinbox.core.event import Event
from kinbox.testing import record
from tests.unit.test_failures import Harness, T

pytestmark = pytest.mark.unit


class PlainBase(BaseException):
    """A library's own BaseException, as trio's or gevent's are."""


def base_app(raise_: BaseException, awaits: bool) -> App:
    app = App(group_id="g")

    def fail(event: Event) -> None:
        if event.id == "raises":
            raise raise_

    if awaits:

        @app.handler(T, max_attempts=2)
        async def apply_async(event: Event, tx: Any) -> None:
            await asyncio.sleep(0)
            fail(event)
            tx.effects.append(event.id)

    else:

        @app.handler(T, max_attempts=2)
        def apply(event: Event, tx: Any) -> None:
            fail(event)
            tx.effects.append(event.id)

    return app


HANDLERS = pytest.mark.parametrize("awaits", [False, True], ids=["sync", "async"])


@HANDLERS
@pytest.mark.parametrize("exit_", [SystemExit(3), KeyboardInterrupt()], ids=repr)
def test_a_handler_asking_to_exit_stops_the_worker_and_its_batch_rolls_back(
    exit_: BaseException, awaits: bool
) -> None:
    h = Harness(base_app(exit_, awaits))
    h.add(record(T, 0, 0, "before"), record(T, 0, 1, "raises"), record(T, 0, 2, "after"))
    with pytest.raises(ExitRequested, match=rf"the handler of {T}\[0\]@1 \(event 'raises'\)"):
        h.run()
    assert h.store.effects == [] and h.committed is None
    assert h.store.status == {}


@HANDLERS
@pytest.mark.parametrize("other", [PlainBase("no"), GeneratorExit()], ids=repr)
def test_another_base_exception_of_a_handler_is_a_failed_try_of_its_event(
    other: BaseException, awaits: bool
) -> None:
    h = Harness(base_app(other, awaits))
    h.add(record(T, 0, 0, "before"), record(T, 0, 1, "raises"), record(T, 0, 2, "after"))
    h.run(turns=4)
    assert h.store.effects == ["before", "after"]
    assert h.store.status["raises"] == "dead_lettered"
    assert "HandlerAborted" in h.store.reasons["raises"]
    assert h.committed == 3
