"""What every run procedure shares: the target, its namespace, the sizes, the live processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from kinbox.bench.contenders import Contender
from kinbox.bench.process import Child, start_contender
from kinbox.bench.resources import PARTITIONS, Namespace
from kinbox.bench.spec import ChildSpec, Sizes, Target
from kinbox.core.errors import KinboxError


@dataclass
class Context:
    """One benchmark invocation's shared state."""

    target: Target
    namespace: Namespace
    sizes: Sizes
    log_dir: Path
    tick: Callable[[float], None] = lambda _fraction: None
    """Told the fraction done of the run in progress (the progress bar)."""
    children: list[Child] = field(default_factory=list)
    _admin: AdminClient | None = field(default=None, init=False, repr=False)

    def connect(self) -> psycopg.Connection[Any]:
        """An autocommit connection to the target database."""
        return psycopg.connect(self.target.database_url, autocommit=True)

    def spec(
        self, contender: Contender, group: str, topic: str, schema: str, table: str,
        kafka: dict[str, str] | None = None,
    ) -> ChildSpec:  # fmt: skip
        """The orders of a contender's process."""
        return ChildSpec(
            contender=contender.name,
            entry=contender.entry,
            bootstrap_servers=self.target.bootstrap_servers,
            database_url=self.target.database_url,
            group=group,
            topic=topic,
            schema=schema,
            table=table,
            kafka={**self.target.kafka, **(kafka or {})},
        )

    def start(self, spec: ChildSpec, name: str, failpoints: str = "") -> Child:
        """Start a contender process; :meth:`stop_all` stops it if still running."""
        child = start_contender(spec, name, self.log_dir, failpoints)
        self.children.append(child)
        return child

    def stop_all(self, timeout: float = 15.0) -> None:
        """Stop every process this run started: SIGTERM, then SIGKILL after ``timeout``.

        The interrupted or failed path. A clean stop lets a consumer leave its
        group, so the group can be deleted at once; a killed member would hold
        it until its session times out.
        """
        for child in self.children:
            child.terminate()
        deadline = time.monotonic() + timeout
        for child in self.children:
            child.wait_exit(max(0.0, deadline - time.monotonic()))
            child.kill()
        self.children.clear()

    def holders(self, group: str) -> int | None:
        """How many members of ``group`` hold partitions, once it is stable with all assigned.

        ``None`` while it is not (joining, rebalancing, unknown to the coordinator).
        """
        if self._admin is None:
            self._admin = AdminClient(self.target.client_config())
        try:
            found = self._admin.describe_consumer_groups([group])[group].result(10)
        except KafkaException:
            return None
        held = [len(m.assignment.topic_partitions) for m in found.members if m.assignment]
        if found.state != ConsumerGroupState.STABLE or sum(held) < PARTITIONS:
            return None
        return sum(1 for n in held if n)

    def wait_assigned(self, group: str, child: Child, timeout: float = 120.0) -> None:
        """Wait until ``group`` is stable with every partition assigned.

        Raises:
            KinboxError: the process exited, or the group did not settle in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            if not child.alive():
                raise KinboxError(f"{child.name} exited ({child.returncode})\n{child.log_tail()}")
            if self.holders(group) is not None:
                return
            if time.monotonic() > deadline:
                raise KinboxError(f"{group}: not assigned after {timeout:.0f}s\n{child.log_tail()}")
            time.sleep(0.05)
