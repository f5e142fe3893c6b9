"""Reused event ids: a duplicate whose payload differs from its id's first one.

The claim keeps a digest of each record's raw value (the bytes before any
deserializer) beside its id. A later delivery of the id is a duplicate, and
is never applied; but when its digest differs, it is a different event under
a reused id (a producer's bug, two producers sharing ids), which the worker
reports (:class:`Sighting`) instead of dropping it silently.

The digest is XXH3's 64 bits (the ``xxhash`` package), stored as a
PostgreSQL ``bigint``: one C call per record, a tenth of a cryptographic
digest's cost, which a claim pays for every event it takes. It need not
resist an adversary, only tell payloads apart: two different payloads share
one by a chance of 2**-64, which would merely leave one reuse unreported.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xxhash import xxh3_64_digest, xxh3_64_intdigest

if TYPE_CHECKING:
    from kinbox.core.event import Event


_SIGN = 1 << 63


def payload_digest(value: bytes) -> int:
    """The digest of a record's raw ``value``: a signed 64-bit integer (a ``bigint``)."""
    # XXH3's unsigned 0..2**64-1 read as signed, bit for bit (two's complement).
    return (xxh3_64_intdigest(value) ^ _SIGN) - _SIGN


def payload_digests(values: Iterable[bytes]) -> array[int]:
    """The digests of ``values``, in order: :func:`payload_digest` of each, in fewer steps.

    A claim digests every event it takes, so this is on its path: the
    unsigned digests go into an array of unsigned 64-bit machine words,
    whose bytes are then read as signed ones (the same two's complement
    reading), instead of two integer operations per value in Python.
    """
    signed = array("q")
    signed.frombytes(array("Q", map(xxh3_64_intdigest, values)).tobytes())
    return signed


def packed_digests(values: Iterable[bytes]) -> bytes:
    """The digests of ``values``, each as its 8 bytes, big-endian, one after another.

    The bytes of each are those PostgreSQL's ``int8send`` gives for the
    stored ``bigint`` (the same two's complement), so a statement compares a
    stored digest with a slice of these bytes. This is the cheapest way to
    send many digests: one C call per value and one join, where a
    ``bigint[]`` literal costs a decimal conversion per value in Python.
    """
    return b"".join(map(xxh3_64_digest, values))


@dataclass(frozen=True, slots=True)
class Sighting:
    """A delivery of an id already claimed with a different payload: not applied, reported.

    Attributes:
        event: the delivery (its position is where the id came again).
        first_topic: the topic of the record that claimed the id's row.
        first_partition: its partition.
        first_offset: its offset.
    """

    event: Event
    first_topic: str
    first_partition: int
    first_offset: int

    @property
    def first(self) -> str:
        """The first position as ``topic[partition]@offset``."""
        return f"{self.first_topic}[{self.first_partition}]@{self.first_offset}"

    @property
    def again(self) -> str:
        """The new delivery's position as ``topic[partition]@offset``."""
        e = self.event
        return f"{e.topic}[{e.partition}]@{e.offset}"
