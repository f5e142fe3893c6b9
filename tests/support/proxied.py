"""A Kafka broker of a test module's own, behind a TCP fault proxy: :class:`ProxiedBroker`.

The broker advertises the proxy's port, so every client connection after the
bootstrap goes through the proxy, and a test can blackhole or cut the link
(:mod:`tests.support.faultproxy`), or kill and pause the broker itself,
without disturbing the session's broker. The fixture is ``proxied_broker``
(tests/conftest.py), one per test module.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinbox.devstack.kafka import KafkaBroker
from tests.support.faultproxy import FaultProxy


@dataclass(frozen=True)
class ProxiedBroker:
    """A broker a test may kill and pause, and the proxy its clients go through."""

    server: KafkaBroker
    proxy: FaultProxy

    def kill(self) -> None:
        """SIGKILL the broker."""
        self.server.kill()

    def start(self) -> None:
        """Start the broker again (same ports, same data)."""
        self.server.start()

    def pause(self) -> None:
        """SIGSTOP the broker."""
        self.server.pause()

    def resume(self) -> None:
        """SIGCONT the broker."""
        self.server.resume()

    @property
    def bootstrap_servers(self) -> str:
        """The advertised address: the proxy's."""
        return self.server.bootstrap_servers

    def close(self) -> None:
        """Stop the broker, then the proxy."""
        self.server.close()
        self.proxy.close()


def start_proxied_broker() -> ProxiedBroker:
    """Start a proxy, then a broker advertising its port behind it.

    Raises:
        ServiceError: the broker did not start (the proxy is closed again).
    """
    proxy = FaultProxy(None)
    server = KafkaBroker(advertised_port=proxy.port)
    proxy.target = ("127.0.0.1", server.port)
    proxy.start()
    try:
        server.start()
    except BaseException:
        proxy.close()
        raise
    return ProxiedBroker(server, proxy)
