"""The trace id of a record's W3C ``traceparent`` header, for ``processed_events.trace_id``.

A leaf: it imports nothing of kinbox, so the store can call it on the claim's
hot path. It never raises: the header is whatever a producer wrote, and
kinbox's own bookkeeping must never fail on content (a malformed header is
stored as NULL, the claim goes on).

The header is ``version-traceid-parentid-flags``: two, 32, 16 and two
lowercase hex digits joined by ``-`` (https://www.w3.org/TR/trace-context/).
Version ``ff`` is invalid, and so is an all-zero trace or parent id. A later
version may append fields after the flags; the first four are read as they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

HEADER = "traceparent"

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = b"0" * 32
_ZERO_PARENT = b"0" * 16


def trace_id(headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """The 32-hex trace id of the first ``traceparent`` header, or ``None`` if there is none valid.

    Only the first header of that name counts, as W3C asks of a repeated one
    (a repeated ``traceparent`` is invalid; its first value is the best guess,
    and a wrong guess only costs the link to a trace).
    """
    for name, value in headers:
        if name == HEADER:
            return _parse(value)
    return None


def _parse(value: bytes | None) -> str | None:
    if not isinstance(value, bytes):
        return None
    found = _TRACEPARENT.fullmatch(value.strip(b" \t"))
    if found is None:
        return None
    version, trace, parent, _flags, rest = found.groups()
    if version == b"ff" or trace == _ZERO_TRACE or parent == _ZERO_PARENT:
        return None
    if version == b"00" and rest is not None:
        return None  # version 00 has exactly four fields
    return trace.decode("ascii")
