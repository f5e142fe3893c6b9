"""`kinbox dev` serves a working stack, and leaves no broker or postgres behind however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from confluent_kafka import Consumer, Producer

from kinbox.devstack.command import READY_LINE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@contextmanager
def running_dev(*args: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """Start `kinbox dev ARGS`, wait for its ready line, yield it with the addresses it printed."""
    expected = {"KINBOX_BOOTSTRAP_SERVERS", "KINBOX_DATABASE_URL"}
    if "--cdc" in args:
        expected.add("KINBOX_CONNECT_URL")
    with subprocess.Popen(
        [sys.executable, "-m", "kinbox.devstack", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None and process.stderr is not None
            env: dict[str, str] = {}
            while len(env) < len(expected):
                key, _, value = (
                    process.stdout.readline().removeprefix("export ").strip().partition("=")
                )
                assert key, "kinbox dev exited before printing its addresses"
                env[key] = value
            while not process.stderr.readline().startswith(READY_LINE):
                assert process.poll() is None, "kinbox dev exited before it was ready"
            assert set(env) == expected, env
            yield process, env
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if _alive(pid)]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_dev_serves_kafka_and_postgres_then_leaves_nothing(how: int) -> None:
    with running_dev() as (process, env):
        services = _children(process.pid)
        assert len(services) == 2, services  # the JVM and the postmaster

        # A second "terminal": produce, consume and connect with the printed addresses.
        bootstrap = env["KINBOX_BOOTSTRAP_SERVERS"]
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce("dev-check", b"ping")
        assert producer.flush(30) == 0
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "dev", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe(["dev-check"])
        got = None
        for _ in range(30):
            message = consumer.poll(1.0)
            if message is not None and not message.error():
                got = message.value()
                break
        consumer.close()
        assert got == b"ping"
        with psycopg.connect(env["KINBOX_DATABASE_URL"]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)

        # When the dev process is interrupted (Ctrl-C) or killed outright
        os.kill(process.pid, how)
        process.wait(timeout=60)

        # Then neither the broker nor the postmaster is left running
        assert _wait_gone(services) == []


def test_interrupted_test_run_leaves_no_service_behind() -> None:
    # Given a test run (its own stack, not the shared one) holding a broker and a postmaster
    target = os.path.join(os.path.dirname(__file__), "interrupt_target.py")
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", target],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("KINBOX_TEST_")},
        # A shell's background job would have SIGINT ignored; a terminal's would not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as run:
        assert run.stdout is not None
        line = ""
        while "holding" not in line:
            line = run.stdout.readline()
            assert line or run.poll() is None, "the inner test run ended early"
        services = _children(run.pid)
        assert len(services) == 2, (line, services)

        # When it gets Ctrl-C
        run.send_signal(signal.SIGINT)
        run.wait(timeout=60)

    # Then neither service outlives it
    assert _wait_gone(services) == []
