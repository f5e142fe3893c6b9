"""Helpers for the operations tests: a worker process of ops_app, HTTP probes, records."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kinbox.devstack.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
FAST = ["-X", "heartbeat.interval.ms=500", "-X", "topic.metadata.refresh.interval.ms=2000"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def topic_pair(
    bootstrap: str, partitions: int = 1, config: dict[str, str] | None = None,
    dlq_config: dict[str, str] | None = None,
) -> str:  # fmt: skip
    """Create a fresh topic and its ``.dlq`` (so no worker races the creation); return its name.

    A worker creates a missing dead-letter topic itself, but describing it at
    once may still find it unknown to the broker's metadata (seen on a busy
    machine); these tests are not about that.
    """
    name = f"ops-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [
        NewTopic(name, partitions, 1, config=config or {}),
        NewTopic(f"{name}.dlq", partitions, 1, config=dlq_config or {}),
    ]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    return name


def probe(port: int, path: str) -> tuple[int, str]:
    """GET ``http://127.0.0.1:port/path``: the status code and the body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def start_worker(
    stack: Stack, topic: str, group: str, schema: str, *args: str,
    database_url: str | None = None, env: dict[str, str] | None = None,
    stderr: Any = None, global_args: Sequence[str] = (), fast: bool = True,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``kinbox [global_args] worker tests.integration.ops_app:app [args]`` as a real process."""
    environ = {
        **os.environ,
        "KINBOX_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "KINBOX_DATABASE_URL": database_url or stack.database_url,
        "KINBOX_GROUP_ID": group,
        "KINBOX_SCHEMA": schema,
        "KINBOX_SESSION_TIMEOUT": "6",
        "KINBOX_MAX_POLL_INTERVAL": "30",
        "KINBOX_RETRY_INITIAL": "0.1",
        "KINBOX_RETRY_MAX": "1",
        "OPS_TEST_TOPIC": topic,
        **(env or {}),
    }
    environ.pop("KINBOX_FAILPOINTS", None)
    command = [sys.executable, "-m", "kinbox", *global_args]
    # A KIP-848 group (-X group.protocol=consumer) refuses the heartbeat setting.
    command += ["worker", "tests.integration.ops_app:app", *(FAST if fast else []), *args]
    return subprocess.Popen(command, cwd=ROOT, env=environ, stderr=stderr)


def produce(
    bootstrap: str, topic: str, payloads: Sequence[dict[str, Any]], *,
    partition: int | None = None, headers: Sequence[tuple[str, bytes]] = (),
) -> list[str]:  # fmt: skip
    """Send one record per payload with a fresh ``event-id``; return the ids."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    ids = []
    for payload in payloads:
        event_id = str(uuid.uuid4())
        ids.append(event_id)
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        producer.produce(
            topic,
            json.dumps(payload).encode(),
            headers=[("event-id", event_id.encode()), *headers],
            **extra,
        )
    assert producer.flush(30) == 0
    return ids


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """SIGTERM ``process`` and wait; SIGKILL it if it does not end."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return int(process.returncode)
