"""A producer for records no well-behaved client writes: header *names* of arbitrary bytes.

confluent-kafka's ``Producer`` (like the Java client) only takes header names
as ``str`` and encodes them as UTF-8, yet Kafka's wire format allows any
bytes, and other clients or a broken producer do send them. The tests need
such records to prove the consumer copes, so this module drives the
librdkafka that ships inside the confluent-kafka wheel directly, through
``ctypes``: ``rd_kafka_header_add`` takes the name with an explicit length.

Only what the tests need: produce to a given partition, wait for every
delivery report, return each record's offset.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass

import confluent_kafka

RawHeaders = Sequence[tuple[bytes, bytes | None]]

_PRODUCER = 0
_MSG_F_COPY = 0x2
_VTYPE_TOPIC, _VTYPE_PARTITION, _VTYPE_VALUE, _VTYPE_KEY = 1, 3, 4, 5
_VTYPE_OPAQUE, _VTYPE_MSGFLAGS, _VTYPE_HEADERS = 6, 7, 10


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Union(ctypes.Union):
    # rdkafka.h pads the union to 64 bytes, so an rd_kafka_vu_t is 72 bytes.
    _fields_ = [
        ("cstr", ctypes.c_char_p),
        ("i", ctypes.c_int),
        ("i32", ctypes.c_int32),
        ("mem", _Mem),
        ("ptr", ctypes.c_void_p),
        ("_pad", ctypes.c_char * 64),
    ]


class _Vu(ctypes.Structure):
    _fields_ = [("vtype", ctypes.c_int), ("u", _Union)]


class _Message(ctypes.Structure):
    """``rd_kafka_message_t`` (the fields a delivery report needs)."""

    _fields_ = [
        ("err", ctypes.c_int),
        ("rkt", ctypes.c_void_p),
        ("partition", ctypes.c_int32),
        ("payload", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("key", ctypes.c_void_p),
        ("key_len", ctypes.c_size_t),
        ("offset", ctypes.c_int64),
        ("_private", ctypes.c_void_p),
    ]


_DeliveryCb = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Message), ctypes.c_void_p)


def _library() -> ctypes.CDLL:
    base = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    found = sorted(glob.glob(os.path.join(base, "confluent_kafka.libs", "librdkafka*.so*")))
    if not found:
        raise RuntimeError(f"no librdkafka next to confluent-kafka in {base}")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
    ]  # fmt: skip
    lib.rd_kafka_conf_set_dr_msg_cb.argtypes = [ctypes.c_void_p, _DeliveryCb]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_headers_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_header_add.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t, ctypes.c_char_p, ctypes.c_ssize_t,
    ]  # fmt: skip
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Vu), ctypes.c_size_t]
    lib.rd_kafka_error_string.restype = ctypes.c_char_p
    lib.rd_kafka_error_string.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_error_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    return lib


@dataclass(frozen=True)
class RawRecord:
    """One record to write: everything as bytes, header names included."""

    partition: int
    value: bytes | None
    headers: RawHeaders = ()
    key: bytes | None = None


def produce_raw(bootstrap: str, topic: str, records: Sequence[RawRecord]) -> list[int]:
    """Write ``records`` in order (idempotent producer); return each one's offset.

    Raises:
        AssertionError: a record was not acknowledged by the broker.
    """
    lib = _library()
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    settings = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": "true",
        "linger.ms": "5",
    }
    for name, value in settings.items():
        if lib.rd_kafka_conf_set(conf, name.encode(), value.encode(), errstr, 512) != 0:
            raise AssertionError(f"librdkafka refused {name}={value}: {errstr.value!r}")
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def delivered(_rk: int | None, msg: ctypes._Pointer[_Message], _opaque: int | None) -> None:
        report = msg.contents
        index = report._private  # the opaque given at produce time
        if report.err:
            errors.append(f"record {index}: {lib.rd_kafka_err2str(report.err)!r}")
        else:
            offsets[int(index or 0) - 1] = int(report.offset)

    callback = _DeliveryCb(delivered)  # kept alive until destroy below
    lib.rd_kafka_conf_set_dr_msg_cb(conf, callback)
    rk = lib.rd_kafka_new(_PRODUCER, conf, errstr, 512)
    if not rk:
        raise AssertionError(f"rd_kafka_new failed: {errstr.value!r}")
    try:
        for index, record in enumerate(records):
            _produce_one(lib, rk, topic, record, index + 1)  # opaque 0 would read as NULL
            lib.rd_kafka_poll(rk, 0)
        left = lib.rd_kafka_flush(rk, 60_000)
        assert left == 0, f"librdkafka flush left {left} record(s) unacknowledged"
    finally:
        lib.rd_kafka_destroy(rk)
    assert not errors, errors[:3]
    assert len(offsets) == len(records), (len(offsets), len(records))
    return [offsets[i] for i in range(len(records))]


def _produce_one(lib: ctypes.CDLL, rk: int, topic: str, record: RawRecord, opaque: int) -> None:
    headers = lib.rd_kafka_headers_new(max(1, len(record.headers)))
    for name, value in record.headers:
        size = -1 if value is None else len(value)
        if lib.rd_kafka_header_add(headers, name, len(name), value, size) != 0:
            lib.rd_kafka_headers_destroy(headers)
            raise AssertionError(f"rd_kafka_header_add refused {name!r}")
    vus = (_Vu * 7)()
    vus[0].vtype, vus[0].u.cstr = _VTYPE_TOPIC, topic.encode()
    vus[1].vtype, vus[1].u.i32 = _VTYPE_PARTITION, record.partition
    vus[2].vtype, vus[2].u.i = _VTYPE_MSGFLAGS, _MSG_F_COPY
    # Buffers live until produceva returns; MSG_F_COPY makes librdkafka copy them.
    buffers = []
    for slot, vtype, data in ((3, _VTYPE_VALUE, record.value), (4, _VTYPE_KEY, record.key)):
        vus[slot].vtype = vtype
        if data is not None:  # a NULL pointer: a null value (tombstone) or no key
            buffer = ctypes.create_string_buffer(data, len(data))
            buffers.append(buffer)
            vus[slot].u.mem.ptr = ctypes.cast(buffer, ctypes.c_void_p).value
            vus[slot].u.mem.size = len(data)
    vus[5].vtype, vus[5].u.ptr = _VTYPE_HEADERS, headers
    vus[6].vtype, vus[6].u.ptr = _VTYPE_OPAQUE, opaque
    error = lib.rd_kafka_produceva(rk, vus, 7)
    if error:
        # On failure the headers were not adopted by a message: still ours.
        lib.rd_kafka_headers_destroy(headers)
        text = lib.rd_kafka_error_string(error)
        lib.rd_kafka_error_destroy(error)
        raise AssertionError(f"rd_kafka_produceva: {text!r}")
