"""A small client for Kafka Connect's REST API: register a connector and wait until it runs.

Only what ``kinbox outbox debezium-config --register`` and the benchmark's
CDC contender need, on the standard library: ``PUT /connectors/<name>/config``
creates or updates in one call, then ``GET /connectors/<name>/status`` is
polled until the connector and every task say ``RUNNING``. A ``FAILED``
state ends the wait at once with the worker's own error (the first lines of
its trace), so a wrong password or a missing plugin reads as such, not as a
time-out.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kinbox.core.errors import ConnectorError

_TRACE_LINES = 6


@dataclass(frozen=True)
class ConnectorState:
    """The connector's state and each task's, as Connect reports them."""

    name: str
    connector: str
    tasks: tuple[str, ...]
    errors: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        """The connector and at least one task, all of them, are RUNNING."""
        return self.connector == "RUNNING" and bool(self.tasks) and set(self.tasks) == {"RUNNING"}

    @property
    def failed(self) -> bool:
        """The connector or a task is FAILED."""
        return self.connector == "FAILED" or "FAILED" in self.tasks


class ConnectClient:
    """Talks to one Connect worker (any worker of the cluster will do)."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in {"http", "https"} or not parsed.netloc:
            raise ConnectorError(f"Kafka Connect URL {url!r}: expected http(s)://host:port")
        self.url = url.rstrip("/")
        self._timeout = timeout

    def _call(self, method: str, path: str, body: object | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                text = reply.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail).get("message", detail)
            raise ConnectorError(
                f"Kafka Connect at {self.url} answered {exc.code} to {method} {path}: {detail}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectorError(f"cannot reach Kafka Connect at {self.url}: {exc}") from exc
        return json.loads(text) if text else None

    def version(self) -> str:
        """The Kafka Connect version of the worker answering."""
        return str((self._call("GET", "/") or {}).get("version", "unknown"))

    def plugins(self) -> dict[str, str]:
        """The connector plugins the worker has: class → version."""
        return {
            str(plugin.get("class")): str(plugin.get("version"))
            for plugin in self._call("GET", "/connector-plugins") or []
        }

    def names(self) -> list[str]:
        """The connectors the cluster runs."""
        return [str(name) for name in self._call("GET", "/connectors")]

    def put_config(self, name: str, config: dict[str, str]) -> bool:
        """Create or update connector ``name``; return True when it was created."""
        quoted = urllib.parse.quote(name, safe="")
        existed = name in self.names()
        self._call("PUT", f"/connectors/{quoted}/config", config)
        return not existed

    def state(self, name: str) -> ConnectorState:
        """The connector's current state."""
        quoted = urllib.parse.quote(name, safe="")
        status = self._call("GET", f"/connectors/{quoted}/status")
        connector = status.get("connector", {})
        tasks = status.get("tasks", [])
        errors = [_first_lines(connector.get("trace"))] + [
            f"task {task.get('id')}: {_first_lines(task.get('trace'))}" for task in tasks
        ]
        return ConnectorState(
            name=name,
            connector=str(connector.get("state", "UNKNOWN")),
            tasks=tuple(str(task.get("state", "UNKNOWN")) for task in tasks),
            errors=tuple(error for error in errors if error and not error.endswith(": ")),
        )

    def restart(self, name: str) -> None:
        """Restart the connector and its failed tasks."""
        quoted = urllib.parse.quote(name, safe="")
        self._call("POST", f"/connectors/{quoted}/restart?includeTasks=true&onlyFailed=true")

    def stop(self, name: str) -> None:
        """Stop the connector: its tasks shut down, its configuration and offsets stay.

        Unlike a pause, a stopped Debezium task holds no replication
        connection, so the slot goes inactive and nothing is decoded until
        :meth:`resume` (Kafka Connect 3.5 or newer).
        """
        self._call("PUT", f"/connectors/{urllib.parse.quote(name, safe='')}/stop")

    def resume(self, name: str) -> None:
        """Start a stopped (or paused) connector's tasks again."""
        self._call("PUT", f"/connectors/{urllib.parse.quote(name, safe='')}/resume")

    def delete(self, name: str) -> None:
        """Remove connector ``name`` (its replication slot stays: drop it yourself)."""
        self._call("DELETE", f"/connectors/{urllib.parse.quote(name, safe='')}")

    def wait_running(
        self,
        name: str,
        *,
        timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> ConnectorState:
        """Poll until the connector and its tasks run.

        Raises:
            ConnectorError: a FAILED state (with Connect's error), or ``timeout``.
        """
        return self._wait(name, "RUNNING", lambda s: s.running, timeout, clock, sleep)

    def wait_stopped(
        self, name: str, *, timeout: float = 60.0, sleep: Callable[[float], None] = time.sleep
    ) -> ConnectorState:
        """Poll until the connector is STOPPED (after :meth:`stop`: its tasks are gone).

        Raises:
            ConnectorError: a FAILED state (with Connect's error), or ``timeout``.
        """
        return self._wait(name, "STOPPED", _stopped, timeout, time.monotonic, sleep)

    def _wait(
        self,
        name: str,
        wanted: str,
        done: Callable[[ConnectorState], bool],
        timeout: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> ConnectorState:
        deadline = clock() + timeout
        last: ConnectorState | None = None
        while True:
            try:
                last = self.state(name)
            except ConnectorError as exc:
                # 404 right after a PUT: the worker has not read its config topic yet.
                if "404" not in str(exc):
                    raise
            if last is not None and done(last):
                return last
            if last is not None and last.failed:
                raise ConnectorError(
                    f"connector {name!r} failed (connector {last.connector}, tasks "
                    f"{', '.join(last.tasks) or 'none'}):\n" + "\n".join(last.errors)
                )
            if clock() > deadline:
                seen = f"connector {last.connector}, tasks {last.tasks}" if last else "no status"
                raise ConnectorError(
                    f"connector {name!r} not {wanted} after {timeout:.0f}s ({seen})"
                )
            sleep(0.25)


def register(
    url: str, connector: dict[str, Any], *, timeout: float = 60.0
) -> tuple[bool, ConnectorState]:
    """Create or update ``connector`` (``{"name", "config"}``) and wait until it runs.

    A connector that was FAILED before the update (an old error) is restarted
    once, so a fixed configuration clears the old failure.

    Returns:
        ``(created, state)``.
    """
    client = ConnectClient(url)
    name = connector["name"]
    created = client.put_config(name, connector["config"])
    if not created:
        try:
            previous = client.state(name)
        except ConnectorError:
            previous = None
        if previous is not None and previous.failed:
            client.restart(name)
    return created, client.wait_running(name, timeout=timeout)


def _stopped(state: ConnectorState) -> bool:
    return state.connector == "STOPPED"


def _first_lines(trace: object) -> str:
    if not trace:
        return ""
    return "\n".join(str(trace).strip().splitlines()[:_TRACE_LINES])
