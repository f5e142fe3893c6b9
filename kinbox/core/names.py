"""Validation of the names kinbox puts into SQL and Kafka requests.

Schema and table names reach SQL only through ``psycopg.sql.Identifier``;
validating them as well means a typo fails at start-up with a clear message
instead of creating an oddly quoted schema.
"""

from __future__ import annotations

import re

from kinbox.core.errors import ConfigurationError

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# Kafka's own rule (kafka.common.internals.Topic): legal characters and at most 249 of them.
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def sql_identifier(value: str, *, setting: str) -> str:
    """Return ``value`` if it is a plain lower-case PostgreSQL identifier.

    Raises:
        ConfigurationError: naming ``setting``, the value and the allowed form.
    """
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            f"{setting}={value!r} is not allowed: use 1-63 characters of a-z, 0-9 and _, "
            "not starting with a digit"
        )
    return value


def topic_name(value: str, *, setting: str = "topic") -> str:
    """Return ``value`` if it is a legal Kafka topic name.

    Raises:
        ConfigurationError: naming ``setting``, the value and the allowed form.
    """
    if not isinstance(value, str) or not _TOPIC.fullmatch(value) or value in {".", ".."}:
        raise ConfigurationError(
            f"{setting}={value!r} is not a legal Kafka topic name: use 1-249 characters "
            "of a-z, A-Z, 0-9, '.', '_' and '-'"
        )
    return value
