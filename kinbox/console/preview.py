"""A record's headers and payload as text a page may show: decoded, bounded, never markup.

The console shows whatever a producer wrote — HTML, script, control
characters, binary. This module only turns bytes into bounded text (valid
UTF-8 as text, JSON pretty-printed, anything else as hex); escaping is the
templates' autoescaping, and the page's Content-Security-Policy forbids
inline script besides (see :mod:`kinbox.console.app`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

PAYLOAD_CHARS = 4000
"""Characters of a payload shown; the rest is cut, and the page says how much was."""
HEADER_CHARS = 600

_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if chr(c) not in "\n\t"} | {0x7F: "\\x7f"}


@dataclass(frozen=True)
class Preview:
    """A payload made presentable.

    Attributes:
        kind: ``json``, ``text``, ``binary`` or ``empty``.
        text: what to show (at most :data:`PAYLOAD_CHARS` characters).
        size: the payload's length in bytes.
        cut: whether ``text`` was shortened.
    """

    kind: str
    text: str
    size: int
    cut: bool


def payload(value: bytes | None, limit: int = PAYLOAD_CHARS) -> Preview:
    """A preview of a record's value."""
    if not value:
        return Preview("empty", "", 0, False)
    try:
        decoded = value.decode("utf-8")
    except UnicodeDecodeError:
        shown = value[: limit // 3].hex(" ")
        return Preview("binary", shown, len(value), len(value) > limit // 3)
    kind = "text"
    try:
        decoded = json.dumps(json.loads(decoded), indent=2, ensure_ascii=False)
        kind = "json"
    except ValueError:
        pass
    text = visible(decoded)
    return Preview(kind, text[:limit], len(value), len(text) > limit)


def headers(items: Sequence[tuple[str, bytes | None]]) -> list[tuple[str, str]]:
    """Each header as ``(name, value)`` text; a value that is not UTF-8 as hex."""
    return [(visible(name)[:200], value_text(value)) for name, value in items]


def value_text(value: bytes | None, limit: int = HEADER_CHARS) -> str:
    """A header value as bounded text: ``(null)``, UTF-8, or ``0x`` and its hex."""
    if value is None:
        return "(null)"
    try:
        text = visible(value.decode("utf-8"))
    except UnicodeDecodeError:
        text = "0x" + value.hex()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def visible(text: str) -> str:
    """``text`` with control characters (but newline and tab) written as escapes."""
    return text.translate(_CONTROL)
