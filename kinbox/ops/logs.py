"""Log output for every ``kinbox`` command: text for people, ``--log-format json`` for machines.

JSON is one object a line: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
``pid``, ``message``, and the fields a log site adds with ``extra=`` —
kinbox's use ``topic``, ``partition``, ``offset``, ``event_id``, ``group``,
``dlq_topic``, ``row_id`` where they have one — plus ``exception`` (the
traceback) when there is one. Values that are not JSON become their
``str()``.

Never a secret: both formats pass the message, the extra fields and the
traceback through :func:`kinbox.core.config.redact_url`, the masking the
settings use, so a password in a PostgreSQL URL or conninfo is ``***``
even where a log site (or a library's exception text) quotes one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any

from kinbox.core.config import redact_url

_HANDLER = "kinbox"

FORMATS = ("text", "json")
"""Values of ``--log-format`` / ``KINBOX_LOG_FORMAT``."""

# What every LogRecord carries; anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, secrets masked (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": redact_url(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = _plain(value)
        if record.exc_info:
            out["exception"] = redact_url(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exception"] = redact_url(record.exc_text)
        if record.stack_info:
            out["stack"] = redact_url(self.formatStack(record.stack_info))
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL [pid] logger: message``, secrets masked (members of one worker differ)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The record as text, with any password masked."""
        return redact_url(super().format(record))


def configure(level: str | None = None, fmt: str = "text", *, force: bool = False) -> None:
    """Log to stderr at ``level`` (default: INFO, or the level set before) in ``fmt``.

    Without ``force``, a root logger that has handlers already is left alone,
    as :func:`logging.basicConfig` would (the ``kinbox`` group configures it
    before a subcommand runs; a test runner may have its own). With it,
    kinbox's own handler is replaced and other handlers are kept.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    if root.handlers and not force:
        return
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    if level is not None or root.level == logging.WARNING:  # WARNING: never set
        root.setLevel((level or "INFO").upper())


def _plain(value: object) -> object:
    """``value`` if JSON can hold it as it is, else its text; strings masked."""
    if isinstance(value, str):
        return redact_url(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return redact_url(str(value))
