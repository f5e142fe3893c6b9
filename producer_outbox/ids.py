"""Event ids: time-ordered UUIDs (RFC 9562, version 7), the outbox's default.

Every consumer claims an event by inserting its id into the primary key of
``processed_events`` (and the outbox itself keys its rows by it). Random ids
(version 4) land on a random leaf page of that index each: on a table of
millions of rows each claim reads a page that is probably not cached, dirties
it, and — the first change to a page after a checkpoint — writes the whole
8 KB page to the WAL. Ids that grow with time land on the index's newest
pages, which stay cached and take many claims per page
(``kinbox bench --scenario large --event-ids time-ordered`` measures it;
``docs/benchmarks.md`` says what random ids cost).

The layout, most significant bits first::

    48  unix time, milliseconds
     4  version (7)
    12  a fraction of the millisecond, 1/4096ths ("rand_a" used as extra
        clock precision: RFC 9562, section 6.2, method 3)
     2  variant (0b10)
    62  random

Within a process the ids strictly increase, also when the clock steps back
or two ids fall in the same 1/4096 ms: the stamp then moves one step past
the last one. Across processes they are ordered by their clocks, which is
all the index needs; uniqueness rests on the 62 random bits.

Python 3.14 has :func:`uuid.uuid7`; this module serves 3.11 on, and its
ids are valid version-7 UUIDs either way.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_FRACTION_BITS = 12
_RANDOM_BITS = 62
_STAMP_MAX = (1 << (48 + _FRACTION_BITS)) - 1

_lock = threading.Lock()
_last = 0


def from_stamp(stamp: int, random_bits: int) -> uuid.UUID:
    """The version-7 UUID of ``stamp`` (milliseconds << 12 | 1/4096ths) and 62 random bits.

    Raises:
        ValueError: ``stamp`` or ``random_bits`` does not fit its field.
    """
    if not 0 <= stamp <= _STAMP_MAX:
        raise ValueError(f"stamp {stamp} does not fit in 60 bits")
    if not 0 <= random_bits < 1 << _RANDOM_BITS:
        raise ValueError(f"random_bits {random_bits} does not fit in 62 bits")
    millis, fraction = stamp >> _FRACTION_BITS, stamp & ((1 << _FRACTION_BITS) - 1)
    value = (millis << 80) | (7 << 76) | (fraction << 64) | (0b10 << 62) | random_bits
    return uuid.UUID(int=value)


def stamp_of(when_ns: int) -> int:
    """The 60-bit stamp of ``when_ns`` (nanoseconds since the epoch)."""
    millis, rest = divmod(when_ns, 1_000_000)
    return (millis << _FRACTION_BITS) | (rest << _FRACTION_BITS) // 1_000_000


def new_event_id() -> uuid.UUID:
    """A fresh time-ordered event id, greater than every one this process made before."""
    global _last
    stamp = stamp_of(time.time_ns())
    with _lock:
        # The same 1/4096 ms as the last id, or a clock that stepped back:
        # one step past the last id keeps this process's ids increasing.
        if stamp <= _last:
            stamp = _last + 1
        _last = stamp
    return from_stamp(stamp, int.from_bytes(os.urandom(8), "big") >> 2)
