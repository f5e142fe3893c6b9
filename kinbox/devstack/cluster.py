"""A Kafka cluster of several KRaft nodes on loopback (``kinbox dev --brokers 3``).

Each node is a :class:`~kinbox.devstack.kafka.KafkaBroker` that is broker and
controller at once, and the controllers form one quorum (three voters
tolerate one down). Replicated as production is: replication factor N for
every topic, the internal ones included, and ``min.insync.replicas`` N - 1,
so one node may die without a single acknowledged write being lost or a
producer with ``acks=all`` being refused. Heaps are kept small, so three
nodes fit beside the tests on a small machine.

The cluster can lose a node and get it back (SIGKILL or controlled shutdown,
then a restart on the same ports and data), which the fault suite does to the
leader of a partition, to a consumer group's coordinator and to every node in
turn; :meth:`KafkaCluster.in_sync` says when the replicas have caught up again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka.admin import AdminClient

from kinbox.core.errors import ServiceError
from kinbox.devstack.kafka import KafkaBroker, new_cluster_id
from kinbox.devstack.process import free_port

NODE_HEAP = "512m"
"""Largest JVM heap of one node of a cluster."""


def replication_settings(nodes: int) -> dict[str, str]:
    """The ``server.properties`` entries of a node of an ``nodes``-node cluster."""
    replicas, isr = str(nodes), str(max(1, nodes - 1))
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "6",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": isr,
        # A node that died is fenced, and its partitions led elsewhere, after
        # 6 s without a heartbeat instead of 9.
        "broker.session.timeout.ms": "6000",
        "broker.heartbeat.interval.ms": "1000",
    }


class KafkaCluster:
    """``nodes`` Kafka nodes (broker + controller each) sharing one controller quorum.

    Args:
        nodes: how many (3: one may be down at a time).
        settings: extra ``server.properties`` entries for every node.
    """

    def __init__(self, nodes: int = 3, settings: dict[str, str] | None = None) -> None:
        if nodes < 1:
            raise ServiceError(f"a Kafka cluster needs at least one node, not {nodes}")
        controllers = {node_id: free_port() for node_id in range(1, nodes + 1)}
        voters = ",".join(f"{n}@127.0.0.1:{port}" for n, port in controllers.items())
        cluster_id = new_cluster_id()
        extra = {**replication_settings(nodes), **(settings or {})}
        self.nodes: dict[int, KafkaBroker] = {}
        """The nodes by node id (1..N)."""
        try:
            for node_id, port in controllers.items():
                self.nodes[node_id] = KafkaBroker(
                    settings=extra, node_id=node_id, controller_port=port, voters=voters,
                    cluster_id=cluster_id, heap=NODE_HEAP,
                )  # fmt: skip
        except BaseException:
            self.close()
            raise
        self.version = next(iter(self.nodes.values())).version

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address, comma-separated."""
        return ",".join(node.bootstrap_servers for node in self.nodes.values())

    @property
    def pids(self) -> dict[int, int | None]:
        """Each node's process id while it runs."""
        return {node_id: node.pid for node_id, node in self.nodes.items()}

    def node(self, node_id: int) -> KafkaBroker:
        """The node with ``node_id`` (a broker id as the admin API reports it)."""
        return self.nodes[node_id]

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Launch every node, then wait until each serves metadata naming all of them."""
        for node in self.nodes.values():
            node.launch()
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        self._wait(self._all_registered, deadline, "every node registered")
        return self

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Start node ``node_id`` again after a kill or a stop; wait until it is back."""
        deadline = time.monotonic() + timeout
        node = self.nodes[node_id]
        node.launch()
        node.wait_ready(max(1.0, deadline - time.monotonic()))
        self._wait(self._all_registered, deadline, f"node {node_id} registered again")

    def in_sync(self, timeout: float = 10.0) -> bool:
        """Whether every partition of every topic has all its replicas in sync."""
        try:
            metadata = self._admin().list_topics(timeout=timeout)
        except Exception:  # a node is still coming back: not in sync
            return False
        partitions = [p for t in metadata.topics.values() for p in t.partitions.values()]
        return bool(partitions) and all(
            p.error is None and set(p.isrs) == set(p.replicas) for p in partitions
        )

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Wait until :meth:`in_sync` (after a node came back, before the next may go)."""
        self._wait(self.in_sync, time.monotonic() + timeout, "every replica in sync")

    def close(self) -> None:
        """Stop every node and remove its files.

        SIGKILL, not a controlled shutdown: the data goes with the cluster,
        and one by one the last nodes would wait for a quorum that has
        already gone before giving up.
        """
        for node in self.nodes.values():
            node.kill()
            node.close()

    def _admin(self) -> AdminClient:
        live = ",".join(n.bootstrap_servers for n in self.nodes.values() if n.pid is not None)
        return AdminClient({"bootstrap.servers": live or self.bootstrap_servers, "log_level": 0})

    def _all_registered(self) -> bool:
        try:
            metadata = self._admin().list_topics(timeout=2)
        except Exception:
            return False
        return set(metadata.brokers) == set(self.nodes)

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while not ready():
            if time.monotonic() > deadline:
                tails = "\n".join(node.log_tail() for node in self.nodes.values())
                raise ServiceError(f"the Kafka cluster did not get to {what}\n{tails}")
            time.sleep(0.2)
