"""Worker settings: one frozen dataclass, filled from flags > ``KINBOX_*`` env > app > defaults.

Every setting has a default except the ones naming the outside world
(``database_url``, ``group_id``); :meth:`Settings.validate` checks them all at
start-up and names the setting, the value and what is allowed. Secrets
(database passwords, SASL/SSL secrets in ``-X`` overrides) never appear in
``repr()``, logs or error messages: :meth:`Settings.redacted` masks them.

A librdkafka property given with ``-X`` wins over the setting that would
otherwise produce it (``-X max.poll.interval.ms`` over ``max_poll_interval``),
so whatever kinbox derives from such a setting reads the value the consumer
really has: :attr:`Settings.effective_max_poll_interval` and
:attr:`Settings.effective_session_timeout`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from kinbox.core.errors import ConfigurationError
from kinbox.core.names import sql_identifier

ENV_PREFIX = "KINBOX_"

# kinbox's offset guarantee rests on these; an override would silently break it.
_PROTECTED_KAFKA_KEYS = {
    "enable.auto.commit": "kinbox commits offsets itself, after the database commit",
    "enable.auto.offset.store": "kinbox commits offsets itself, after the database commit",
    "group.id": "use --group-id / KINBOX_GROUP_ID",
}
_SECRET_KEY = re.compile(r"password|secret|token|jaas|oauthbearer\.config|key\.pem|credential")
_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*(@)")
_URL_SECRET = re.compile(r"(://[^:/@]*:)([^@]*)@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)
MASK = "***"

DEFAULT_ID_HEADERS = ("event-id", "ce_id")
"""Event id headers read by default: kinbox's own, then CloudEvents' binary-mode ``ce_id``.

Debezium's outbox router also writes a header named ``id``; it is not read by
default because many producers put an *entity* id in a header of that
generic name, and kinbox would then merge distinct events of one entity
silently. Add it with ``--id-header`` / ``KINBOX_ID_HEADERS`` where the
router is in use.
"""

_MS_OVERRIDES = {
    "max.poll.interval.ms": "max_poll_interval",
    "session.timeout.ms": "session_timeout",
}
"""librdkafka properties in milliseconds that override a setting in seconds."""

MISSING_ID_POLICIES = ("dead-letter", "derive", "fail")
"""Values of ``missing_id``: what to do with a record whose event id is missing or invalid.

``dead-letter`` sends it to the dead-letter topic; ``derive`` uses
``topic/partition/offset`` as its id, which only suppresses *consumer*
redelivery of that same record, never a producer's duplicate (a resend lands
at another offset); ``fail`` stops the worker with an error, committing
nothing past the record.
"""

TRACE_CONTEXT_MODES = ("auto", "parent", "link")
"""Values of ``trace_context``: how a handler's span relates to the producer's trace.

``parent`` makes the record's trace context (its ``traceparent`` header) the
parent of the ``process`` span, so one trace runs from the producer to the
handler; ``link`` keeps the span in the worker's own trace (under the
partition batch's span) and links the producer's context; ``auto`` (the
default) is ``parent`` for per-event handlers and ``link`` for batch
handlers, whose events come from many traces (a span has one parent). Either
way the span links the producer's context.
"""


@dataclass(frozen=True, repr=False)
class Settings:
    """Everything a worker needs to run; see the module docstring for precedence."""

    bootstrap_servers: str = "localhost:9092"
    """Kafka brokers, ``host:port[,host:port...]``."""
    database_url: str = ""
    """PostgreSQL URL or conninfo string; its password is masked wherever it is shown."""
    group_id: str = ""
    """Consumer group, and the scope of deduplication: an event is applied once per group."""
    schema: str = "kinbox"
    """Schema of the kinbox tables (``processed_events``, the outbox)."""
    id_headers: tuple[str, ...] = DEFAULT_ID_HEADERS
    """Headers the event id is read from, in order of preference (env: comma-separated)."""
    batch_max_messages: int = 500
    """Most records one poll returns, 1..100000."""
    batch_max_wait: float = 0.1
    """Longest wait of one poll for records, seconds."""
    shutdown_timeout: float = 30.0
    """Seconds every stop ends within: batches in flight, offset commits, closing."""
    max_poll_interval: float = 300.0
    """Seconds the consumer allows between polls (``-X max.poll.interval.ms`` wins)."""
    session_timeout: float = 45.0
    """Seconds of silence before the group drops a member (``-X session.timeout.ms`` wins)."""
    pool_size: int = 4
    """Database connections, and so partition batches in flight at once."""
    retry_initial: float = 0.5
    """First backoff of a failed batch or an outage, seconds; it doubles, with jitter."""
    retry_max: float = 30.0
    """Longest backoff, seconds (outages, undeliverable dead letters, failed tries)."""
    max_attempts: int = 5
    """Handler tries before an event is dead-lettered, 1..1000."""
    missing_id: str = "dead-letter"
    """A record without a valid event id: ``dead-letter``, ``derive`` or ``fail``."""
    breaker_failures: int = 10
    """Distinct events failing in a row that open the circuit breaker; 0 turns it off."""
    breaker_pause: float = 30.0
    """Seconds an open circuit breaker keeps every partition paused."""
    health_port: int = 0
    """Port of ``/livez`` and ``/readyz`` (:mod:`kinbox.ops.health`); 0: no endpoints."""
    live_timeout: float = 0.0
    """Seconds without a poll before ``/livez`` fails; 0: ``effective_max_poll_interval``."""
    trace_context: str = "auto"
    """How a handler's span relates to the producer's trace: ``parent``, ``link`` or ``auto``."""
    metrics_port: int = 0
    """Port of the Prometheus ``/metrics`` endpoint (the ``otel`` extra); 0: none."""
    kafka_overrides: Mapping[str, str] = field(default_factory=dict)
    """librdkafka properties given with ``-X key=value`` (not read from the environment)."""

    def validate(self) -> Settings:
        """Check every setting; return ``self`` so calls chain.

        Raises:
            ConfigurationError: naming the first bad setting, its value and what is allowed.
        """
        if not self.bootstrap_servers.strip():
            _bad("bootstrap_servers", self.bootstrap_servers, "host:port[,host:port...]")
        if not self.database_url.strip():
            _bad("database_url", "", "a PostgreSQL URL (--database-url or KINBOX_DATABASE_URL)")
        if not self.group_id.strip() or len(self.group_id.encode()) > 255:
            _bad("group_id", self.group_id, "1-255 bytes (--group-id, KINBOX_GROUP_ID or App)")
        sql_identifier(self.schema, setting="schema")
        if not self.id_headers or any(not h or not isinstance(h, str) for h in self.id_headers):
            _bad("id_headers", self.id_headers, "one or more non-empty header names")
        if not 1 <= self.batch_max_messages <= 100_000:
            _bad("batch_max_messages", self.batch_max_messages, "1..100000")
        for name in ("batch_max_wait", "shutdown_timeout", "retry_initial", "retry_max"):
            if not getattr(self, name) > 0:
                _bad(name, getattr(self, name), "a positive number of seconds")
        for key, name in _MS_OVERRIDES.items():
            raw = self.kafka_overrides.get(key)
            if raw is not None and _milliseconds(raw) is None:
                _bad(f"-X {key}", raw, f"a whole number of milliseconds >= 1 (overrides {name})")
        poll_interval = self.effective_max_poll_interval
        if self._classic_group and not 1 <= self.effective_session_timeout <= poll_interval:
            _bad(
                "session_timeout",
                self.effective_session_timeout,
                f"1s..max_poll_interval ({poll_interval}s)",
            )
        if not 1 <= self.max_attempts <= 1000:
            _bad("max_attempts", self.max_attempts, "1..1000 (handler tries before dead-lettering)")
        if not 0 <= self.breaker_failures <= 100_000:
            _bad(
                "breaker_failures",
                self.breaker_failures,
                "0..100000 (events failing in a row that pause the worker; 0: never)",
            )
        if not self.breaker_pause > 0:
            _bad("breaker_pause", self.breaker_pause, "a positive number of seconds")
        if self.missing_id not in MISSING_ID_POLICIES:
            _bad("missing_id", self.missing_id, " | ".join(MISSING_ID_POLICIES))
        if not 0 <= self.health_port <= 65535:
            _bad("health_port", self.health_port, "0 (off) or a TCP port 1..65535")
        if not self.live_timeout >= 0:
            _bad("live_timeout", self.live_timeout, "0 (max_poll_interval) or seconds > 0")
        if self.trace_context not in TRACE_CONTEXT_MODES:
            _bad("trace_context", self.trace_context, " | ".join(TRACE_CONTEXT_MODES))
        if not 0 <= self.metrics_port <= 65535:
            _bad("metrics_port", self.metrics_port, "0 (no endpoint) or a TCP port, 1..65535")
        if self.pool_size < 1:
            _bad("pool_size", self.pool_size, "1 or more")
        for key in self.kafka_overrides:
            if key in _PROTECTED_KAFKA_KEYS:
                _bad(f"-X {key}", self.kafka_overrides[key], _PROTECTED_KAFKA_KEYS[key])
        return self

    @property
    def effective_max_poll_interval(self) -> float:
        """Seconds the consumer allows between polls: ``-X max.poll.interval.ms`` wins."""
        return self._seconds("max.poll.interval.ms", self.max_poll_interval)

    @property
    def effective_session_timeout(self) -> float:
        """Seconds of silence before the group drops this member: ``-X session.timeout.ms`` wins.

        Under ``-X group.protocol=consumer`` (KIP-848) the broker decides it
        instead (``group.consumer.session.timeout.ms``) and kinbox sets none.
        """
        return self._seconds("session.timeout.ms", self.session_timeout)

    @property
    def _classic_group(self) -> bool:
        return self.kafka_overrides.get("group.protocol", "classic") == "classic"

    def _seconds(self, key: str, setting: float) -> float:
        millis = _milliseconds(self.kafka_overrides.get(key))
        return setting if millis is None else millis / 1000

    @property
    def effective_live_timeout(self) -> float:
        """Seconds without a poll before ``/livez`` fails (default: the poll interval allowed)."""
        return self.live_timeout or self.effective_max_poll_interval

    def for_member(self, index: int) -> Settings:
        """The settings of member ``index`` of a ``--processes N`` worker.

        A static ``group.instance.id`` names one member: given to N processes
        as it is, every one but the last to join would be fenced. Each member
        gets ``<id>-<index>`` instead, the same on every restart, so static
        membership keeps working (a restarted member takes its place back).
        Health and metrics endpoints, one port each, are on ``port + index``
        (N processes cannot share one port).
        """
        changes: dict[str, Any] = {}
        if self.health_port:
            changes["health_port"] = self.health_port + index
        if self.metrics_port:
            changes["metrics_port"] = self.metrics_port + index
        instance = self.kafka_overrides.get("group.instance.id")
        if instance:
            changes["kafka_overrides"] = {
                **self.kafka_overrides,
                "group.instance.id": f"{instance}-{index}",
            }
        return dataclasses.replace(self, **changes) if changes else self

    def redacted(self) -> dict[str, Any]:
        """Return the settings as a dict that is safe to log: secrets are masked."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["database_url"] = redact_url(self.database_url)
        out["kafka_overrides"] = {
            k: (MASK if _SECRET_KEY.search(k) else v) for k, v in self.kafka_overrides.items()
        }
        return out

    def secret_values(self) -> list[str]:
        """The secrets held here, verbatim: the database password, secret ``-X`` values.

        For a masking that cannot rely on a secret's surroundings (a page that
        shows text from anywhere): each of these is to be replaced wherever it
        appears. Empty values are left out.
        """
        found = [m.group(2) for m in _URL_SECRET.finditer(self.database_url)]
        found += [unquote(value) for value in found]  # as a library may quote it, decoded
        found += [m.group(2).strip("'") for m in _KV_PASSWORD.finditer(self.database_url)]
        found += [v for k, v in self.kafka_overrides.items() if _SECRET_KEY.search(k)]
        return sorted({value for value in found if value}, key=len, reverse=True)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.redacted().items())
        return f"Settings({inner})"

    @classmethod
    def load(
        cls,
        flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        base: Settings | None = None,
    ) -> Settings:
        """Merge ``flags`` (not ``None`` values) over ``KINBOX_*`` in ``env`` over ``base``.

        ``base`` carries the app's own choices (``App(group_id=...)``) over the
        defaults. Env values are parsed by the field's type; tuples are
        comma-separated. The result is not validated: call :meth:`validate`.

        Raises:
            ConfigurationError: an env value does not parse, or a flag is unknown.
        """
        current = base or cls()
        fields = {f.name: f for f in dataclasses.fields(cls)}
        changes: dict[str, Any] = {}
        for name in fields:
            raw = (env or {}).get(ENV_PREFIX + name.upper())
            if raw is not None and name != "kafka_overrides":
                changes[name] = _parse(name, raw, getattr(current, name))
        for name, value in (flags or {}).items():
            if name not in fields:
                raise ConfigurationError(f"unknown setting {name!r}")
            if value is None:
                continue
            if name == "kafka_overrides":
                value = {**current.kafka_overrides, **value}
            changes[name] = value
        return dataclasses.replace(current, **changes)


def redact_url(url: str) -> str:
    """Mask the password in a PostgreSQL URL or ``key=value`` conninfo string."""
    return _KV_PASSWORD.sub(rf"\g<1>{MASK}", _URL_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", url))


def _parse(name: str, raw: str, default: object) -> Any:
    try:
        if isinstance(default, tuple):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(default, bool):
            return raw.lower() in {"1", "true", "yes", "on"}
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        shown = MASK if "url" in name else raw
        raise ConfigurationError(
            f"{ENV_PREFIX}{name.upper()}={shown!r} is not a valid {type(default).__name__}"
        ) from None
    return raw


def _milliseconds(raw: str | None) -> int | None:
    """``raw`` as a positive whole number of milliseconds, or ``None`` (absent or not one)."""
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        return None
    return value if value >= 1 else None


def _bad(name: str, value: object, allowed: str) -> None:
    raise ConfigurationError(f"{name}={value!r} is not allowed: {allowed}")
