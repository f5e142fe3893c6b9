"""Run only by test_devstack_lifecycle: a test that holds the stack until it is interrupted."""

from __future__ import annotations

import time

from kinbox.devstack.stack import Stack


def test_hold_the_stack(stack: Stack) -> None:
    print(
        f"holding {stack.kafka and stack.kafka.pid} {stack.postgres and stack.postgres.pid}",
        flush=True,
    )
    time.sleep(300)
