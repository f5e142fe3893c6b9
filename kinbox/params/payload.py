"""Decoding a record's value into the type a handler's first parameter names.

=======================  =========================================================
annotation               what the handler gets
=======================  =========================================================
``bytes``                the value as it is
``str``                  the value decoded as UTF-8
``dict`` (``dict[...]``) the value parsed as a JSON object (item types unchecked)
a dataclass              built from the JSON object (:mod:`kinbox.params.structs`)
a pydantic model         ``Model.model_validate_json(value)``
anything else            validated by pydantic's ``TypeAdapter``: a pydantic
                         dataclass, a ``TypedDict``, ``list[int]``... (needs the
                         ``pydantic`` extra)
``T | None``             ``None`` for an empty value (a tombstone), else as ``T``
=======================  =========================================================

With ``value_deserializer=`` (per handler, or the App's default for its typed
handlers) the value goes through it first — a callable ``bytes -> object``, or
a confluent-kafka ``Deserializer`` such as ``confluent_kafka.schema_registry``'s
Avro, Protobuf or JSON Schema one, which also gets the topic and the headers:
the Kafka driver reads with it (:mod:`kinbox.kafka.serde`, handed over when
the worker starts, see :class:`~kinbox.params.wrap.Prepared`). What it
returns is then converted to the annotation: kept when it already is an
instance (a Protobuf message), else validated as above from Python objects
(an Avro record's dict into a pydantic model, say); no annotation takes it as
it is.

Everything is chosen here, at registration: a call runs one prepared function.
A value that does not decode or validate raises
:class:`~kinbox.core.errors.InvalidPayload`, a permanent failure: dead-lettered at
once with reason ``payload``, its message carrying the validation error.
kinbox's own exceptions from a deserializer (``Retry``, ``DeadLetter``) pass
through unchanged; so a schema registry that cannot be reached means ``Retry``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import sys
import typing
from collections.abc import Callable
from typing import Any

from kinbox.core.describe import describe
from kinbox.core.errors import ConfigurationError, InvalidPayload, KinboxError
from kinbox.core.event import Event
from kinbox.core.transport import ValueReader
from kinbox.params import structs
from kinbox.params.signature import describe_type, strip

Decode = Callable[[Event], object]
"""One event's payload, decoded; raises :class:`~kinbox.core.errors.InvalidPayload`."""
Convert = Callable[[Any], object]


def decoder(
    target: object, deserializer: object | None, *, where: str, read: ValueReader | None = None
) -> Decode:
    """The function that turns an event into the payload ``target`` asks for.

    ``read`` is the Kafka driver's reader, for a ``deserializer`` that is the
    Kafka client library's (:func:`from_kafka`).

    Raises:
        ConfigurationError: ``target`` cannot be decoded into (say, it needs
            pydantic and pydantic is not installed), or ``deserializer`` is
            not callable.
    """
    inner, optional = _optional(strip(target))
    if deserializer is None:
        decode = _from_bytes(inner, where=where)
    else:
        reader = _reader(deserializer, where=where, read=read)
        decode = _compose(reader, _converter(inner, where=where))
    if optional:
        decode = _tombstone_is_none(decode)
    return _guarded(decode, describe_type(target))


def _from_bytes(target: object, *, where: str) -> Decode:
    if target is bytes:
        return _value
    if target is str:
        return _text
    if _is_mapping(target):
        return _json_object
    if structs.is_plain_dataclass(target):
        build = structs.builder(target)
        return lambda event: build(_json(event))
    decode = _models(target, where=where).json_decoder(target, where=where)
    return lambda event: decode(event.value)


def _converter(target: object, *, where: str) -> Convert:
    """Python object (what a deserializer returned) -> ``target``."""
    if target in (Any, object):
        return _same
    if target in (bytes, str):
        return _instance_of(target)
    if _is_mapping(target):
        return _mapping
    if structs.is_plain_dataclass(target):
        return _keep_instances(target, structs.builder(target))
    convert = _models(target, where=where).python_converter(target, where=where)
    return _keep_instances(target, convert)


def from_kafka(deserializer: object) -> bool:
    """Whether ``deserializer`` is a confluent-kafka ``Deserializer``, which the Kafka driver reads.

    Asked without importing confluent-kafka: a user's deserializer of its
    kind was made by a module that loaded it already.
    """
    serialization = sys.modules.get("confluent_kafka.serialization")
    return serialization is not None and isinstance(deserializer, serialization.Deserializer)


def _reader(deserializer: object, *, where: str, read: ValueReader | None) -> Decode:
    """Event -> what ``deserializer`` makes of its value."""
    if from_kafka(deserializer):
        if read is None:
            raise ConfigurationError(
                f"{where}: value_deserializer={deserializer!r} is read by the Kafka driver, "
                "which the worker hands over when it starts; none was given"
            )
        return read(deserializer)
    if not callable(deserializer):
        raise ConfigurationError(
            f"{where}: value_deserializer={deserializer!r} is not callable "
            "(give a function bytes -> object or a confluent-kafka Deserializer)"
        )
    plain = typing.cast(Callable[[bytes], object], deserializer)
    return lambda event: plain(event.value)


def _guarded(decode: Decode, name: str) -> Decode:
    def run(event: Event) -> object:
        try:
            return decode(event)
        except KinboxError:
            raise
        except Exception as exc:
            raise InvalidPayload(
                f"{event.topic}[{event.partition}]@{event.offset}: the payload is not a valid "
                f"{name}: {describe(exc)}"
            ) from exc

    return run


def _compose(read: Decode, convert: Convert) -> Decode:
    return lambda event: convert(read(event))


def _tombstone_is_none(decode: Decode) -> Decode:
    return lambda event: None if not event.value else decode(event)


def _optional(target: object) -> tuple[object, bool]:
    """``(T, True)`` for ``T | None`` / ``Optional[T]``, else ``(target, False)``."""
    if typing.get_origin(target) in (typing.Union, _UnionType):
        args = [a for a in typing.get_args(target) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(target)) == 2:
            return strip(args[0]), True
    return target, False


_UnionType = type(int | None)


def _is_mapping(target: object) -> bool:
    origin = typing.get_origin(target) or target
    return origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _models(target: object, *, where: str) -> Any:
    """:mod:`kinbox.params.validators`, or why ``target`` cannot be decoded without pydantic."""
    if dataclasses.is_dataclass(target) and not isinstance(target, type):
        raise ConfigurationError(f"{where}: annotate the payload with a type, not {target!r}")
    try:
        from kinbox.params import validators  # loaded only for types pydantic validates
    except ImportError as exc:
        raise ConfigurationError(
            f"{where}: a payload of type {describe_type(target)} is validated by pydantic, "
            "which is not installed: pip install 'kinbox[pydantic]' (bytes, str, dict and "
            "dataclasses need nothing)"
        ) from exc
    return validators


def _value(event: Event) -> bytes:
    return event.value


def _text(event: Event) -> str:
    return event.value.decode("utf-8")


def _json(event: Event) -> Any:
    return json.loads(event.value)


def _json_object(event: Event) -> dict[str, Any]:
    return _mapping(_json(event))


def _mapping(obj: object) -> dict[Any, Any]:
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, collections.abc.Mapping):
        return dict(obj)
    raise TypeError(f"expected a JSON object (a mapping), got {type(obj).__name__}")


def _same(obj: object) -> object:
    return obj


def _instance_of(cls: type) -> Convert:
    def check(obj: object) -> object:
        if not isinstance(obj, cls):
            raise TypeError(f"the deserializer returned {type(obj).__name__}, not {cls.__name__}")
        return obj

    return check


def _keep_instances(target: object, convert: Convert) -> Convert:
    """``convert``, except that an instance of ``target`` is kept as it is."""
    if not isinstance(target, type):
        return convert
    return lambda obj: obj if isinstance(obj, target) else convert(obj)
