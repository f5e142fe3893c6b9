"""What ``kinbox console`` runs with: one frozen dataclass, checked once at start-up."""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError

DEFAULT_PORT = 8470
MIN_TOKEN_CHARS = 16


def new_token() -> str:
    """A fresh random access token (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, repr=False)
class ConsoleSettings:
    """The console's own settings, beside the connection :class:`~kinbox.core.config.Settings`.

    Attributes:
        connection: Kafka, PostgreSQL and the schema (``kinbox status``'s).
        token: the access token; every page but ``/healthz`` and the login asks for it.
        host: address to listen on; loopback by default.
        port: TCP port.
        allow_actions: whether replays, discards, requeues and releases are allowed.
        operator: who acts, when a session or request names no one.
        scan_limit: the newest records read from each dead-letter topic.
        sample_every: seconds between two samples of the overview (and the charts).
        trace_url: a tracing UI's address with ``{trace_id}`` in it, to link trace ids.
        dlq_topics: dead-letter topics beyond those named ``<topic>.dlq``.
        samples_per_group: dead letters shown inside a group.
    """

    connection: Settings
    token: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    allow_actions: bool = False
    operator: str = "operator"
    scan_limit: int = 500
    sample_every: float = 10.0
    trace_url: str | None = None
    dlq_topics: tuple[str, ...] = field(default_factory=tuple)
    samples_per_group: int = 20

    def __repr__(self) -> str:
        return (
            f"ConsoleSettings(host={self.host!r}, port={self.port}, "
            f"allow_actions={self.allow_actions}, token='***')"
        )

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach the console."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def validate(self) -> ConsoleSettings:
        """Check every setting; return ``self``.

        Raises:
            ConfigurationError: naming the setting, its value and what is allowed.
        """
        if len(self.token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"the console's token is {len(self.token)} characters long: use at least "
                f"{MIN_TOKEN_CHARS} (or give none, and one is generated)"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"port={self.port!r} is not allowed: a TCP port 0..65535")
        if not 1 <= self.scan_limit <= 100_000:
            raise ConfigurationError(f"scan_limit={self.scan_limit!r} is not allowed: 1..100000")
        if not 1 <= self.sample_every <= 3600:
            raise ConfigurationError(
                f"sample_every={self.sample_every!r} is not allowed: 1..3600 seconds"
            )
        if self.trace_url is not None and "{trace_id}" not in self.trace_url:
            raise ConfigurationError(
                f"trace_url={self.trace_url!r} is not allowed: a URL with {{trace_id}} in it, "
                "e.g. http://jaeger:16686/trace/{trace_id}"
            )
        if self.trace_url is not None and not self.trace_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"trace_url={self.trace_url!r} is not allowed: an http:// or https:// URL"
            )
        if not self.operator.strip():
            raise ConfigurationError("operator='' is not allowed: a name to record decisions under")
        return self
