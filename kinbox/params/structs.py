"""Standard-library dataclasses built from decoded JSON, without pydantic.

A JSON object becomes the dataclass by field name: keys it does not know are
ignored (a producer may add fields before its consumers know them, as
pydantic's default does), a missing required field is an error, and a field
whose type is itself a dataclass — or a list or an ``Optional`` of one — is
built the same way. The fields' types are not checked: a dataclass declares
them, it does not validate them. Use a pydantic model (or
``pydantic.dataclasses.dataclass``, which kinbox validates with pydantic) when
the types must hold.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any

from kinbox.params.signature import list_item, strip

Build = Callable[[Any], object]


def is_plain_dataclass(target: object) -> bool:
    """A standard-library dataclass class (a pydantic dataclass is validated by pydantic)."""
    return (
        isinstance(target, type)
        and dataclasses.is_dataclass(target)
        and not hasattr(target, "__pydantic_validator__")
    )


@functools.cache
def builder(cls: type) -> Build:
    """The function that builds ``cls`` from a mapping (cached: nested types share it)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a forward reference that does not resolve: build that field as given
        hints = {}
    fields = [(f.name, _nested(hints.get(f.name))) for f in dataclasses.fields(cls) if f.init]

    def build(obj: Any) -> object:
        if not isinstance(obj, collections.abc.Mapping):
            raise TypeError(
                f"expected a JSON object for {cls.__qualname__}, got {type(obj).__name__}"
            )
        values = {}
        for name, convert in fields:
            if name in obj:
                value = obj[name]
                values[name] = value if convert is None else convert(value)
        return cls(**values)

    return build


def _nested(hint: object) -> Build | None:
    """How to build a field of type ``hint`` from JSON, when it holds dataclasses."""
    hint = strip(hint)
    if is_plain_dataclass(hint):
        # Looked up when called, not now: a dataclass may contain itself.
        return lambda value: builder(hint)(value)
    item = list_item(hint)
    if item is not None:
        each = _nested(item)
        return None if each is None else (lambda value: [each(v) for v in value])
    if typing.get_origin(hint) in (typing.Union, type(int | None)):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        one = _nested(options[0]) if len(options) == 1 else None
        return None if one is None else (lambda value: None if value is None else one(value))
    return None
