"""The relay's settings: one frozen dataclass, filled from flags > env > defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from kinbox.core.errors import ConfigurationError
from kinbox.core.names import sql_identifier


@dataclass(frozen=True)
class RelayConfig:
    """Relay settings; build from flags > env > defaults, then :meth:`validate`."""

    database_url: str
    schema: str = "kinbox"
    lanes: int = 16
    batch_size: int = 1000
    poll_interval: float = 1.0
    max_attempts: int = 10
    backoff_base: float = 0.5
    backoff_max: float = 60.0
    retention: timedelta = field(default=timedelta(days=7))
    cleanup_interval: float = 3600.0
    cleanup_batch: int = 1000
    source: str | None = None
    parallel: int = 2
    """Lane groups publishing side by side, each with its own connection and producer."""
    metrics_interval: float = 10.0
    """Seconds between reads of the outbox's backlog for the gauges (only with an SDK)."""

    def validate(self) -> RelayConfig:
        """Return self, or raise :class:`ConfigurationError` naming the bad setting."""
        sql_identifier(self.schema, setting="schema")
        checks: list[tuple[str, object, bool, str]] = [
            ("lanes", self.lanes, 1 <= self.lanes <= 4096, "1..4096"),
            ("batch_size", self.batch_size, 1 <= self.batch_size <= 10_000, "1..10000"),
            ("parallel", self.parallel, 1 <= self.parallel <= 64, "1..64"),
            ("poll_interval", self.poll_interval, 0 < self.poll_interval <= 3600, "(0, 3600]"),
            ("max_attempts", self.max_attempts, self.max_attempts >= 1, ">= 1"),
            ("backoff_base", self.backoff_base, self.backoff_base >= 0, ">= 0"),
            ("backoff_max", self.backoff_max, self.backoff_max >= self.backoff_base, ">= base"),
            ("retention", self.retention, self.retention >= timedelta(0), ">= 0"),
            ("cleanup_interval", self.cleanup_interval, self.cleanup_interval > 0, "> 0"),
            ("cleanup_batch", self.cleanup_batch, self.cleanup_batch >= 1, ">= 1"),
            ("metrics_interval", self.metrics_interval, self.metrics_interval > 0, "> 0"),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise ConfigurationError(f"{name}={value!r} is not allowed: use {allowed}")
        if not self.database_url:
            raise ConfigurationError("database_url is required (--database-url)")
        return self

    def backoff(self, attempts: int) -> float:
        """Seconds to wait before try ``attempts + 1`` (exponential, capped)."""
        return float(min(self.backoff_max, self.backoff_base * 2 ** min(attempts, 30)))
